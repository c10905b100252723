"""The simulations the course grader runs beyond literal cases: the ring cache's no-evicted-read
check (and ``wmtp.kvcache.ring_slot``'s formula and argument checks), the lossless decoding harness
for the verifier, assignment 06's seeded trials, 09's two forks and 10's batched loop, each catching its bug
on its own; and the batch grader's copies and refusals."""

import itertools

import pytest
import torch

from wmtp import decode, grading
from wmtp.decode import verify_greedy
from wmtp.grading_batch import HARNESS, library_commit
from wmtp.grading_fork import library_fork
from wmtp.kvcache import ring_slot

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_grader_out_of_date_with_the_decoder_is_not_blamed_on_the_student(monkeypatch):
    monkeypatch.setattr(decode, "speculative_generate", lambda *args, **kwargs: (torch.zeros(0), None))
    with pytest.raises(grading.GraderError, match="never called the student's verifier"):
        grading.grade_function("greedy_verify", _loop)


def test_ring_simulation_catches_an_evicted_read():
    """A ring with no room for the speculative positions loses window keys (caught by simulation alone)."""
    too_small = lambda p, n_sink, window, depth: p if p < n_sink else n_sink + (p - n_sink) % window  # noqa: E731
    why = grading.ring_no_evicted_read(too_small, 4, 6, 2)
    assert why == "query t=8 reads key 4 from slot 4, but position 10 overwrote it (positions up to 10 written)"
    out_of_range = lambda p, n_sink, window, depth: p  # noqa: E731
    assert "outside the ring's 12 slots" in grading.ring_no_evicted_read(out_of_range, 4, 6, 2)
    for n_sink, window, depth in grading.RING_SIMULATED:
        assert grading.ring_no_evicted_read(ring_slot, n_sink, window, depth) is None


def test_ring_slot_formula_and_arguments():
    assert [ring_slot(p, 2, 3, 1) for p in range(12)] == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 2, 3]
    assert [ring_slot(p, 0, 1, 0) for p in range(4)] == [0, 0, 0, 0]
    for args, name in [((-1, 2, 3, 1), "p"), ((0, -1, 3, 1), "n_sink"), ((0, 2, 0, 1), "window"),
                       ((0, 2, 3, -1), "depth"), ((0, 2, None, 1), "window"), ((True, 2, 3, 1), "p")]:
        with pytest.raises(ValueError, match=name):
            ring_slot(*args)


def test_lossless_harness_catches_over_acceptance():
    accept_all = lambda drafts, target_choice: len(drafts)  # noqa: E731
    why = grading.lossless_harness(accept_all, 1, 4, 16)
    assert why.startswith("output differs from dense greedy from token 2")
    with pytest.raises(ValueError, match="returned 7"):
        grading.lossless_harness(lambda d, c: 7, 1, 4, 16)
    assert grading.lossless_harness(_loop, 2, 0, None) is None


def _loop(drafts, target_choice):
    return decode.verify_greedy_loop(torch.tensor(drafts), torch.tensor(target_choice))


@pytest.mark.parametrize("case", [(4, 6, 10, (17, 24)), (16, 3, 20, (40, 33)), (3, 5, 10, (12, 14))])
def test_two_forks_catch_a_shared_page_and_a_missing_copy(case):
    """Assignment 09's last check on tables the earlier checks would already refuse: it needs no help."""
    from wmtp.grading_fork import _two_forks_case

    def shares(block_table, page_size, filled, needed, free, scratch):  # the page holding `filled` kept shared
        first, last = -(-filled // page_size), min(-(-needed // page_size), len(block_table))
        return block_table[:first] + free[:last - first] + [scratch] * (len(block_table) - last), []

    def no_copy(block_table, page_size, filled, needed, free, scratch):
        table, _ = library_fork(block_table, page_size, filled, needed, free, scratch)
        return table, []

    page_size, filled = case[0], case[2]
    assert "a page of the prompt" in _two_forks_case(shares, *case, 0)
    bad = filled // page_size * page_size  # the copied page's first row, a prompt position
    assert f"reads position {bad} as 0, expected {bad + 1:g} (the prompt's)" in _two_forks_case(no_copy, *case, 0)
    assert _two_forks_case(library_fork, *case, 0) is None


def test_rejection_distribution_catches_resampling_p():
    """Assignment 06's seeded trials on their own: after a rejection, a sample of ``p`` (not of the
    residual) commits the tokens too rarely where ``q`` covered ``p``; the rule itself passes."""
    from wmtp.grading_rejection import _distribution_case

    def resample_p(p, q, draft, u, r):
        if u * q[draft] < p[draft]:
            return draft
        return next((i for i, c in enumerate(itertools.accumulate(p)) if c > r), len(p) - 1)

    def rule(p, q, draft, u, r):
        if u * q[draft] < p[draft]:
            return draft
        residual = [max(a - b, 0.0) for a, b in zip(p, q)]
        return next(i for i, c in enumerate(itertools.accumulate(residual)) if c > r * sum(residual))

    p, q = [0.7, 0.2, 0.1], [1 / 3] * 3
    assert "more than 5 standard errors off: the output must be distributed as p" in \
        _distribution_case(resample_p, p, q, 101)
    assert _distribution_case(rule, p, q, 101) is None


def _rows_alone(drafts, choices, positions, live):
    """Every row committed as if live: a stopped row moves on."""
    return library_commit(drafts, choices, positions, [True] * len(live))


def _lockstep(drafts, choices, positions, live):
    m = min(verify_greedy(torch.tensor(d), torch.tensor(c)) for d, c, on in zip(drafts, choices, live) if on)
    return [(d[:m] + [c[m]], p + m + 1) if on else ([], p) for d, c, p, on in zip(drafts, choices, positions, live)]


@pytest.mark.parametrize("case", HARNESS, ids=[f"K={c[0]},lengths={c[1]}" for c in HARNESS])
def test_batched_loop_catches_a_moving_stopped_row_and_lockstep(case):
    """Assignment 10's last checks on their own: every multi-row batch has a stopped row beside live
    ones, and a row that drafted well must not wait for the others (lockstep's output is still right)."""
    from wmtp.grading_batch import _harness_case

    assert _harness_case(library_commit, *case) is None
    if len(case[1]) > 1:
        assert "has stopped, but it committed [" in _harness_case(_rows_alone, *case)
        assert "whatever the other rows accept" in _harness_case(_lockstep, *case)


def test_batch_grader_passes_copies_and_refuses_bad_answers():
    """A function that empties its arguments after answering fails, as the task says (the grader's
    own batch is untouched: it passed copies); an answer of the wrong length or with a bool position
    is refused with what it should be."""
    def clears(drafts, choices, positions, live):
        rows = library_commit(drafts, choices, positions, live)
        drafts.clear(), choices.clear(), positions.clear(), live.clear()
        return rows

    cleared = grading.grade_function("batch", clears)
    assert "commit_rows changed its argument drafts from [[4, 7, 1], [4, 7, 1], [2, 2, 2]] to []" in \
        cleared.first_failure and "do not change the arguments" in cleared.first_failure
    short = grading.grade_function("batch", lambda d, c, p, on: library_commit(d, c, p, on)[1:])
    assert "expected a list of 3 (tokens, new_position) pairs" in short.first_failure
    assert "2 pairs for a batch of 3 rows" in short.first_failure
    boolean = grading.grade_function("batch", lambda d, c, p, on: [(t, True) for t, _ in library_commit(d, c, p, on)])
    assert "True is not an int" in boolean.first_failure


def _commits_past_the_mismatch(drafts, choices, positions, live):
    """Every matching draft counted, not only those before the first mismatch."""
    a = [sum(x == y for x, y in zip(d, c)) for d, c in zip(drafts, choices)]
    return [(d[:n] + [c[n]], p + n + 1) if on else ([], p) for d, c, p, on, n in zip(drafts, choices, positions,
                                                                                     live, a)]


def _stopped_rows_keep_their_drafts(drafts, choices, positions, live):
    """A stopped row commits its accepted drafts (not the target's token) and stays put."""
    a = [verify_greedy(torch.tensor(d), torch.tensor(c)) for d, c in zip(drafts, choices)]
    return [(d[:n] + [c[n]], p + n + 1) if on else (d[:n], p) for d, c, p, on, n in zip(drafts, choices, positions,
                                                                                       live, a)]


def test_batched_loop_catches_matches_past_the_mismatch_and_a_stopped_row_that_keeps_its_drafts():
    """Assignment 10's last check on its own (mutation round 10): past a row's first mismatch the
    target's choices echo some drafts, so counting every match commits too much at once (choices
    never echoing survived every test); a stopped row's drafts all match, so one that keeps them
    shows (a stopped row's choices drawn at random survived)."""
    from wmtp.grading_batch import _harness_case

    assert _harness_case(_commits_past_the_mismatch, *HARNESS[0]) == (
        "step 0, row 0 (prompt length 5, at position 4): drafts [427, 416, 319], right for the first 0, and choices "
        "[448, 416, 319, 77]: it committed [427, 416, 319], expected [448]")
    assert _harness_case(_stopped_rows_keep_their_drafts, *HARNESS[0]) == (
        "step 6, row 2 (prompt length 2, at position 18) has stopped, but it committed [113, 89, 246] and moved to "
        "position 18")


def test_batched_loop_drafts_are_wrong_at_j_whatever_the_rng_draws(monkeypatch):
    """The draft at a row's first mismatch is the target's token plus 1 to V - 1, mod V: never the
    token itself, even when every draw is the lowest (with plus 0 to V - 2 it would be the token once
    in V - 1 draws, the grader's own j then wrong, and the library's commit failed; these seeds drew
    no such case, so the off-by-one survived every test)."""
    import random

    from wmtp import grading_batch

    class Lowest(random.Random):
        def randrange(self, start, stop=None, step=1):
            return 0 if stop is None else start

    monkeypatch.setattr(grading_batch.random, "Random", Lowest)
    assert grading_batch._harness_case(library_commit, *HARNESS[0]) is None


def test_two_forks_catch_a_fork_that_keeps_the_prompts_pages_past_its_own():
    """Entries past the fork's own pages address the scratch page: a fork that keeps the prompt's
    pages there (writing nothing into them) addresses pages it neither shares nor owns (allowing
    every page of the prompt's table survived every test)."""
    from wmtp.grading_fork import _two_forks_case

    def keeps_past(block_table, page_size, filled, needed, free, scratch):
        table, copies = library_fork(block_table, page_size, filled, needed, free, scratch)
        return [block_table[i] if page == scratch else page for i, page in enumerate(table)], copies

    assert _two_forks_case(keeps_past, 4, 6, 10, (17, 24), 0) == (
        "fork 1 addresses pages [8] that are neither the prompt's shared pages, the first free pages it needs, nor "
        "the scratch page")
