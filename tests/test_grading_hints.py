"""The course grader's hints and its simulation checks, each on its own (wmtp/grading_*.py): the
hint that names a known wrong answer, and the checks past the literal and fuzzed cases that no
planted bug reaches through ``grade`` (they pass only a function right on every fuzzed case), run
directly on a wrong function. Written for mutation round 7 (part b): each test failed on a mutant
of the grader that survived tests/test_grading_verdicts.py, test_grading_harness.py and
test_grading_process.py."""

import itertools

import pytest
import torch
from grading_helpers import first_failure

from wmtp.keyset import sink_query_position

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- 04 split-K merge (grading_merge.py)
def test_merge_that_overflows_is_told_to_exponentiate_m_minus_its_max():
    """exp(900) is inf with no empty split: the overflow hint, not the empty split's."""
    def overflows(m, den, acc):
        return (torch.exp(m)[:, None] * acc).sum(0) / (torch.exp(m) * den).sum()

    why = first_failure("splitk_merge", overflows)
    assert why.startswith("merge_splits of scores s=[900.0, -1800.0, 450.0] split into runs of [1, 2] keys (D=2): "
                          "m=[900.0, 450.0], l=[1.0, 1.0]: expected ["), why
    assert why.endswith("got [nan, nan] (NaN or inf with no empty split: exp of scores in the hundreds overflows; "
                        "exponentiate m_i - max m)"), why


def test_merge_gets_copies_of_the_partials_and_reports_the_graders_own():
    """A merge that shifts ``m`` in place is shown the partials it was given (m=[0.5, 2.0]), not its edit."""
    def shifts_m(m, den, acc):
        m.sub_(m.max())
        return acc.sum(0) / den.sum()

    why = first_failure("splitk_merge", shifts_m)
    assert why.startswith("merge_splits of scores s=[0.5, -1.0, 2.0, 0.0] split into runs of [2, 2] keys (D=2): "
                          "m=[0.5, 2.0], l=[1.22313016014843, 1.1353352832366128]: expected ["), why
    assert why.endswith(" (each split's l and acc are relative to its own max m_i: rescale by exp(m_i - max m))")


# ---------------------------------------------------------------- 05 re-indexed positions (grading_reindex.py)
def test_reindexed_hints_for_a_missing_window_and_for_t_itself():
    no_window = lambda t, n_sink, window: t if n_sink == 0 else min(t, n_sink + (window or 0) - 1)  # noqa: E731
    assert first_failure("reindexed", no_window) == (
        "sink_query_position(t=100, n_sink=4, window=None): expected 100, got 3 (without sinks, or without a window, "
        "nothing is re-indexed: the query stays at t)")
    assert first_failure("reindexed", lambda t, n_sink, window: t) == (
        "sink_query_position(t=19, n_sink=2, window=6): expected 7, got 19 (t is the query's absolute position; "
        "re-indexed, it sits at the last index of its key set)")


@pytest.mark.parametrize("fn, why", [
    (lambda t, n_sink, window: t if window is None or not n_sink else min(t, n_sink + window),
     "sink_query_position(t=19, n_sink=2, window=6): expected 7, got 8 (the query sits at the LAST index of the key "
     "set, n_sink + window - 1, once it is full)"),
    (lambda t, n_sink, window: t if window is None else min(t, n_sink + window - 1),
     "sink_query_position(t=100, n_sink=0, window=6): expected 100, got 5 (without sinks, or without a window, "
     "nothing is re-indexed: the query stays at t)"),
    (lambda t, n_sink, window: t if window is None or not n_sink else n_sink + window - 1,
     "sink_query_position(t=7, n_sink=4, window=6): expected 7, got 9 (nothing is evicted while t < n_sink + window: "
     "the key set is still 0 .. 7, the query its last key)"),
    (lambda t, n_sink, window: t if window is None or not n_sink or t <= n_sink + window else n_sink + window - 1,
     "sink_query_position(t=10, n_sink=4, window=6): expected 9, got 10 (the query sits at the LAST index of the "
     "key set, n_sink + window - 1, once it is full)"),
], ids=["one index past", "moved without sinks", "always the last index", "evicting one step late"])
def test_reindexed_hints_for_an_index_past_sinks_ignored_and_the_first_eviction(fn, why):
    """Mutation round 10: the first eviction (t = n_sink + window) a literal case, and each hint for
    its answer (each survived every test: the literal case dropped, the hint's n_sink + window taken
    one lower, the no-sinks hint only without a window, the not-yet-evicted hint never given)."""
    assert first_failure("reindexed", fn) == why


@pytest.mark.parametrize("i, case, where, index, n_keys", [(0, (40, 4, 8), 12, 11, 12), (1, (12, 4, 8), 12, 11, 12),
                                                          (4, (90, 8, 20), 28, 27, 28)])
def test_reindexed_attention_check_catches_a_position_one_past_the_key_set(i, case, where, index, n_keys):
    """The attention check on its own: sinks scored from one index too far move the output by O(0.01-0.1)."""
    from wmtp.grading_reindex import _attention_case

    one_past = lambda t, n_sink, window: min(t, n_sink + window)  # noqa: E731
    why = _attention_case(one_past, *case, i)
    assert why.startswith(f"scoring the sinks from position {where} gives attention "), why
    assert float(why.split(" gives attention ")[1].split(" ")[0]) > 0.02, why
    assert why.endswith(f" away from the compact re-indexed cache (the query at index {index} of the {n_keys} keys "
                        "it reads)"), why
    assert _attention_case(sink_query_position, *case, i) is None


# ---------------------------------------------------------------- 06 rejection sampling (grading_rejection.py)
def _residual(p, q, r):
    """The first token whose cumulative residual mass max(p - q, 0) exceeds r times the total."""
    res = [max(a - b, 0.0) for a, b in zip(p, q)]
    return next(i for i, c in enumerate(itertools.accumulate(res)) if c > r * sum(res))


def test_rejection_that_accepts_only_where_p_covers_q_is_told_the_acceptance_rule():
    def only_where_p_covers(p, q, draft, u, r):
        return draft if p[draft] >= q[draft] else _residual(p, q, r)

    assert first_failure("rejection", only_where_p_covers) == (
        "verify_one(p=[0.2, 0.8], q=[0.6, 0.4], draft=0, u=0.3, r=0.5): expected 0, got 1 (accept when "
        "u * q[draft] < p[draft]: with probability min(1, p/q))")


def test_rejection_trials_catch_a_rule_wrong_in_six_percent_of_rejections_and_a_low_acceptance():
    """The seeded trials on their own (p = [0.7, 0.2, 0.1], q uniform): a rejected draft committed
    when r < 0.06 moves token 0's share by about 7 standard errors; always a sample of p (exactly p's
    distribution) accepts sum(p q) = 1/3 of the drafts, not sum(min(p, q)) = 0.6333."""
    from wmtp.grading_rejection import _distribution_case

    def sloppy(p, q, draft, u, r):
        return draft if u * q[draft] < p[draft] or r < 0.06 else _residual(p, q, r)

    def samples_p(p, q, draft, u, r):
        return next(i for i, c in enumerate(itertools.accumulate(p)) if c > r)

    p, q = [0.7, 0.2, 0.1], [1 / 3] * 3
    assert _distribution_case(sloppy, p, q, 101) == (
        "token 0 was committed in 0.6775 of 20000 trials; p[0] = 0.7000 (more than 5 standard errors off: the output "
        "must be distributed as p)")
    assert _distribution_case(samples_p, p, q, 101) == (
        "accepted 0.3328 of the drafts; speculative sampling accepts sum(min(p, q)) = 0.6333")
    last = lambda p, q, draft, u, r: draft if u * q[draft] < p[draft] else -1  # noqa: E731  (Python's last token)
    assert _distribution_case(last, p, q, 101) == "returned -1 for draft 2: not a token of the vocabulary 0..2"


def test_rejection_that_answers_two_ways_is_caught_by_the_repeated_call():
    """Two answers over the 20 calls are already one too many (the planted random bug gives three)."""
    from wmtp.grading_rejection import REPEATED, _repeated_case

    answers = itertools.cycle([1, 2])
    (p, q, d, u, r), calls = REPEATED
    assert _repeated_case(lambda *args: next(answers), p, q, d, u, r, calls) == (
        "returned 1, 2 for the same arguments over 20 calls: the token must depend on u and r alone (test with u, "
        "sample the residual with r; no random numbers of your own)")


# ---------------------------------------------------------------- 07 paged keys (grading_paged.py)
def test_paged_addresses_in_another_order_are_told_so():
    from wmtp.grading_paged import library_addresses

    assert first_failure("paged", lambda *args: library_addresses(*args)[::-1]) == (
        "key_addresses(block_table=[5, 2, 7, 0], page_size=4, t=13, n_sink=2, window=4): expected [(5, 0), (5, 1), "
        "(7, 2), (7, 3), (0, 0), (0, 1)], got [(0, 1), (0, 0), (7, 3), (7, 2), (5, 1), (5, 0)] (the right addresses "
        "in another order: list them by ascending key position)")


@pytest.mark.parametrize("i, case, n_pages", [(0, (4, 40, 4, 8), 12), (1, (1, 30, 2, 5), 32), (3, (3, 11, 0, None), 5)])
def test_paged_attention_check_catches_logical_pages_and_no_addresses(i, case, n_pages):
    """The attention check on its own: keys read at their logical pages (not the block table's) move
    the output by O(0.1-1); no addresses at all are refused by name."""
    from wmtp.grading_paged import _attention_case, library_addresses
    from wmtp.keyset import draft_key_indices

    def logical(block_table, page_size, t, n_sink, window):
        return [(p // page_size, p % page_size) for p in draft_key_indices(t, n_sink, window).tolist()]

    why = _attention_case(logical, *case, i)
    assert why.startswith("attention over the keys read at your addresses is "), why
    assert float(why.split(" addresses is ")[1].split(" ")[0]) > 0.2, why
    assert why.endswith(f" away from attention over the key set (the cache in {n_pages} randomly permuted pages of "
                        f"{case[0]} rows)"), why
    none = _attention_case(lambda *args: [], *case, i)
    assert none == "no addresses: the key set of a query always holds its own key"
    assert _attention_case(library_addresses, *case, i) is None


# ---------------------------------------------------------------- 08 draft depth (grading_depth.py)
def test_depth_hints_for_the_last_of_a_tie_and_no_length_hint_for_an_index_error_of_its_own():
    """Of a tie (2 / 1 = 3 / 1.5) the smallest depth; an IndexError with as many alphas as costs is the
    student's own, reported as raised, not blamed on extra alphas."""
    from wmtp.policy import expected_tokens

    def last_of_a_tie(alphas, costs):
        rates = [expected_tokens(alphas, k) / costs[k - 1] for k in range(1, len(costs) + 1)]
        return max(range(1, len(costs) + 1), key=lambda k: (rates[k - 1], k))

    assert first_failure("depth", last_of_a_tie) == (
        "best_depth(alphas=[1.0, 1.0], costs=[1.0, 1.5]): expected 1, got 2 (a tie: return the smallest such depth)")
    off_by_one = lambda alphas, costs: max(range(1, len(costs) + 1), key=lambda k: alphas[k] / costs[k - 1])  # noqa: E731
    why = first_failure("depth", off_by_one)
    assert why.startswith("best_depth(alphas=[0.9, 0.9, 0.9], costs=[1.0, 1.0, 1.0]): raised IndexError: list index "
                          "out of range (test_grading_hints.py, line "), why
    assert "alphas but" not in why, why


def test_depth_simulation_catches_a_depth_twelve_standard_errors_short_and_one_out_of_range():
    """The simulated steps on their own (alphas 0.9, costs 1 + 0.05 k, k = 1 .. 7: depth 7 is best)."""
    from wmtp.grading_depth import _simulation_case

    alphas, costs = [0.9] * 7, [1.0 + 0.05 * k for k in range(1, 8)]
    assert _simulation_case(lambda a, c: 6, alphas, costs, 0) == (
        "in 20000 simulated steps at each depth, depth 6 delivered 4.0145 tokens per unit of cost and depth 7 4.2378 "
        "(standard errors 0.0121, 0.0137)")
    assert _simulation_case(lambda a, c: 0, alphas, costs, 0) == "expected a depth in 1 .. 7, got 0"
    assert _simulation_case(lambda a, c: 8, alphas, costs, 0) == "expected a depth in 1 .. 7, got 8"
    assert _simulation_case(lambda a, c: 7, alphas, costs, 0) is None


# ---------------------------------------------------------------- 09 fork table (grading_fork.py)
FORK_CASE = "fork_table(block_table=[5, 2, 7, 0], page_size=4, filled=6, needed=10, free=[9, 3, 8], scratch=1): "


def _swapped(*args):
    from wmtp.grading_fork import library_fork

    table, copies = library_fork(*args)
    return table, [(dst, src) for src, dst in copies]


def _copies_every_page(block_table, page_size, filled, needed, free, scratch):
    held = -(-filled // page_size)  # the prompt's pages, each copied
    mine = free[:max(min(-(-needed // page_size), len(block_table)), held)]
    return mine + [scratch] * (len(block_table) - len(mine)), [(block_table[i], mine[i]) for i in range(held)]


def _unpadded(*args):
    from wmtp.grading_fork import library_fork

    table, copies = library_fork(*args)
    while table[-1] == args[-1]:
        table = table[:-1]
    return table, copies


@pytest.mark.parametrize("fn, got, hint", [
    (_swapped, "([5, 9, 3, 1], [(9, 2)])", "the right table; the copies are (src, dst) pages: the prompt's page, then "
                                           "the fork's"),
    (_copies_every_page, "([9, 3, 8, 1], [(5, 9), (2, 3)])", "the pages wholly below `filled` are shared: keep the "
                                                            "prompt's entries there"),
    (_unpadded, "([5, 9, 3], [(2, 9)])", "the fork's table has one entry per entry of the prompt's"),
])
def test_fork_hints_for_swapped_copies_no_sharing_and_a_short_table(fn, got, hint):
    assert first_failure("fork", fn) == f"{FORK_CASE}expected ([5, 9, 3, 1], [(2, 9)]), got {got} ({hint})"


def _at_the_boundary(page):
    """The library's table, with ``page(block_table, scratch)`` at ``filled``'s entry when it is a
    page boundary that the fork writes past."""
    def fn(block_table, page_size, filled, needed, free, scratch):
        from wmtp.grading_fork import library_fork

        table, copies = library_fork(block_table, page_size, filled, needed, free, scratch)
        if filled % page_size == 0 and filled < needed:
            table[filled // page_size] = page(block_table, scratch, filled // page_size)
        return table, copies
    return fn


def _free_pages_swapped(*args):
    from wmtp.grading_fork import library_fork

    table, copies = library_fork(*args)
    own = [page for page in table[args[2] // args[1]:] if page != args[-1]]
    swap = dict(zip(own, own[::-1]))
    return [swap.get(page, page) for page in table], [(src, swap.get(dst, dst)) for src, dst in copies]


BOUNDARY_CASE = "fork_table(block_table=[5, 2, 7, 0], page_size=4, filled=8, needed=10, free=[9, 3, 8], scratch=1): "


@pytest.mark.parametrize("fn, why", [
    (_at_the_boundary(lambda table, scratch, i: table[i]),
     BOUNDARY_CASE + "expected ([5, 2, 9, 1], []), got ([5, 2, 7, 1], [])"),
    (_at_the_boundary(lambda table, scratch, i: scratch),
     BOUNDARY_CASE + "expected ([5, 2, 9, 1], []), got ([5, 2, 1, 1], [])"),
    (_free_pages_swapped, FORK_CASE + "expected ([5, 9, 3, 1], [(2, 9)]), got ([5, 3, 9, 1], [(2, 3)])"),
    (lambda *args: ([5, 9, 3, 1], [(2, 9)], None),
     FORK_CASE + "expected (table, copies): a list of page ints and a list of (src, dst) int pairs, got ([5, 9, 3, "
                 "1], [(2, 9)], None)"),
], ids=["the prompt's page at a boundary", "scratch at a boundary", "free pages swapped", "three values"])
def test_fork_gives_no_hint_that_does_not_fit(fn, why):
    """Mutation round 10: at a page boundary no prompt position shares the page at ``filled``, so the
    hints about that page (still the prompt's; copy it before writing) do not fit, nor does the
    shared pages' hint for a table right below ``filled``; an answer of three values is refused as
    one (each hint's condition loosened, and the answer's ValueError left uncaught, survived every
    test)."""
    assert first_failure("fork", fn) == why


def test_two_forks_catch_a_copy_into_the_scratch_page_and_pages_from_the_free_lists_end():
    """Assignment 09's last check on its own: a copy must land in a page the fork owns, and a fork
    addresses only the prompt's shared pages, its first free pages and the scratch page."""
    from wmtp.grading_fork import _two_forks_case, library_fork

    def into_scratch(block_table, page_size, filled, needed, free, scratch):
        table, copies = library_fork(block_table, page_size, filled, needed, free, scratch)
        return table, [(src, scratch) for src, _ in copies]

    def from_the_end(block_table, page_size, filled, needed, free, scratch):
        return library_fork(block_table, page_size, filled, needed, free[::-1], scratch)

    assert _two_forks_case(into_scratch, 4, 6, 10, (17, 24), 0) == "fork 1 copies into page 1, which it does not own"
    assert _two_forks_case(from_the_end, 4, 6, 10, (17, 24), 0) == (
        "fork 1 addresses pages [5, 9, 10] that are neither the prompt's shared pages, the first free pages it needs, "
        "nor the scratch page")


# ---------------------------------------------------------------- 10 batch commit (grading_batch.py)
BATCH_CASE = ("commit_rows(drafts=[[4, 7, 1], [4, 7, 1], [2, 2, 2]], choices=[[4, 7, 1, 9], [4, 3, 0, 5], "
              "[8, 2, 2, 2]], positions=[10, 10, 10], live=[True, True, True]): ")
BATCH_EXPECTED = "expected [([4, 7, 1, 9], 14), ([4, 3], 12), ([8], 11)], got "


def _commit(*args):
    from wmtp.grading_batch import library_commit

    return library_commit(*args)


def _stops_every_row(drafts, choices, positions, live):
    rows = _commit(drafts, choices, positions, live)
    live[:] = [False] * len(live)
    return rows


@pytest.mark.parametrize("fn, why", [
    (lambda d, c, p, on: [(t, q + 1 if on[b] else q) for b, (t, q) in enumerate(_commit(d, c, p, on))],
     BATCH_EXPECTED + "[([4, 7, 1, 9], 15), ([4, 3], 13), ([8], 12)] (the new position is the row's latest committed "
                      "token's: positions[0] + 4)"),
    (lambda d, c, p, on: [(t[::-1], q) for t, q in _commit(d, c, p, on)],  # no hint fits tokens out of order
     BATCH_EXPECTED + "[([9, 1, 7, 4], 14), ([3, 4], 12), ([8], 11)]"),
    (_stops_every_row, "commit_rows changed its argument live from [True, True, True] to [False, False, False]: do not "
                       "change the arguments (build new lists for the answer)"),
    (lambda d, c, p, on: _commit(d, c, p, on) + [([], 0)],
     "expected a list of 3 (tokens, new_position) pairs, one a row, tokens a list of ints and new_position an int; got "
     "[([4, 7, 1, 9], 14), ([4, 3], 12), ([8], 11), ([], 0)] (4 pairs for a batch of 3 rows)"),
], ids=["position one past", "tokens reversed", "live changed", "a row too many"])
def test_batch_hints_and_refusals(fn, why):
    assert first_failure("batch", fn) == BATCH_CASE + why


def test_batch_hints_for_a_missing_target_token_and_none_for_a_wrong_first_token():
    """Mutation round 10: a row that commits its accepted drafts alone is told of the target's token
    (the hint's test taken one token longer survived every test); in the batched loop a row whose one
    token is wrong gets no hint that it kept too few (any shorter answer taken as a prefix survived)."""
    from wmtp.grading_batch import HARNESS, _harness_case

    drafts_only = lambda d, c, p, on: [(t[:-1], q - 1) if on[b] and b else (t, q) for b, (t, q) in  # noqa: E731
                                       enumerate(_commit(d, c, p, on))]  # row 0, every draft accepted, right
    assert first_failure("batch", drafts_only) == BATCH_CASE + BATCH_EXPECTED + (
        "[([4, 7, 1, 9], 14), ([4], 11), ([], 10)] (row 1 also commits the target's token choices[1][1] after its 1 "
        "accepted drafts)")
    one_wrong = lambda d, c, p, on: [([t[0] + 1] if on[b] and len(t) > 1 else t, q) for b, (t, q) in  # noqa: E731
                                     enumerate(_commit(d, c, p, on))]
    assert _harness_case(one_wrong, *HARNESS[0]) == (
        "step 0, row 1 (prompt length 9, at position 8): drafts [305, 133, 110], right for the first 3, and choices "
        "[305, 133, 110, 362]: it committed [306], expected [305, 133, 110, 362]")


def test_batched_loop_catches_a_stopped_row_that_only_moves_and_a_live_row_one_position_past():
    """Assignment 10's last check on its own: a stopped row keeps its position even when it commits
    nothing, and a live row's position is its prompt's last plus its committed tokens."""
    from wmtp.grading_batch import HARNESS, _harness_case

    moves = lambda d, c, p, on: [(t, q if on[b] else q + 1) for b, (t, q) in enumerate(_commit(d, c, p, on))]  # noqa: E731
    past = lambda d, c, p, on: [(t, q + 1 if on[b] else q) for b, (t, q) in enumerate(_commit(d, c, p, on))]  # noqa: E731
    assert _harness_case(moves, *HARNESS[0]) == (
        "step 6, row 2 (prompt length 2, at position 18) has stopped, but it committed [] and moved to position 19")
    assert _harness_case(past, *HARNESS[0]) == (
        "step 0, row 0 (prompt length 5, at position 4) committed [448] and moved to position 6, expected 4 (its "
        "prompt's last token) + 1 (its tokens committed so far) = 5")
