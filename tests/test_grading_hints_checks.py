"""The hints and checks of assignments 01-03 (wmtp/grading_checks.py: the key set, the ring slot,
greedy verification), 07 and 08 (grading_paged.py, grading_depth.py), each on its own: the hint
that names a known wrong answer, the ring's no-evicted-read simulation run directly on a wrong
function, and the grader's own cases left as they were by a function that edits its arguments.
Written for mutation round 7 (part c): each test failed on a mutant of the grader that survived
tests/test_grading_verdicts.py, test_grading_harness.py and test_grading_hints.py."""

import itertools

import pytest
from grading_helpers import first_failure

from wmtp import grading_checks
from wmtp.keyset import draft_key_indices
from wmtp.kvcache import ring_slot

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- 01 the key set
def test_keyset_hints_for_keys_out_of_order_and_a_key_too_few():
    descending = lambda t, n_sink, window: draft_key_indices(t, n_sink, window).tolist()[::-1]  # noqa: E731
    assert first_failure("keyset", descending) == (
        "draft_key_indices(t=19, n_sink=2, window=6): expected [0, 1, 14, 15, 16, 17, 18, 19], "
        "got [19, 18, 17, 16, 15, 14, 1, 0] (return the keys in ascending order)")
    one_short = lambda t, n_sink, window: draft_key_indices(t, n_sink, window).tolist()[:-1]  # noqa: E731
    assert first_failure("keyset", one_short) == (
        "draft_key_indices(t=19, n_sink=2, window=6): expected [0, 1, 14, 15, 16, 17, 18, 19], "
        "got [0, 1, 14, 15, 16, 17, 18] (7 keys; the set holds min(t + 1, n_sink + window) = 8)")


# ---------------------------------------------------------------- 02 the ring slot
def test_ring_slot_that_wraps_onto_sink_zero_at_p_equal_n_sink_is_told_it_evicts_a_sink():
    """p = n_sink is the first position past the sinks: slot 0 there is a sink's, and the hint says so."""
    onto_sinks = lambda p, n_sink, window, depth: p if p < n_sink else (p - n_sink) % (window + depth)  # noqa: E731
    assert first_failure("ring_slot", onto_sinks) == (
        "ring_slot(p=4, n_sink=4, window=6, depth=2): expected 4, got 0 (slot 0 is pinned to sink 0: "
        "writing there evicts a sink)")


def test_ring_simulation_runs_past_the_first_lap():
    """Wrong only from p = 14 (past the first lap of 12 slots, t + depth for t = 12), a ring is caught at
    t = 12: the simulation runs queries past the ring's capacity."""
    late = lambda p, n_sink, window, depth: (  # noqa: E731
        ring_slot(p, n_sink, window, depth) if p < n_sink + window + 2 * depth else n_sink + (p - n_sink) % window)
    assert grading_checks.ring_no_evicted_read(late, 4, 6, 2) == (
        "query t=12 reads key 8 from slot 8, but position 14 overwrote it (positions up to 14 written)")


# ---------------------------------------------------------------- 03 greedy verification
def test_verify_hint_for_too_few_accepted_is_none():
    """Acceptance stopping at the first mismatch explains too many accepted, not too few."""
    assert first_failure("greedy_verify", lambda drafts, target_choice: 0) == (
        "accept_count(drafts=[1, 2, 3], target_choice=[1, 2, 3, 9]): expected 3, got 0")


def test_verify_gets_copies_so_a_function_that_empties_its_lists_leaves_the_cases():
    """A right answer that pops its arguments empty passes, and the literal cases are as they were."""
    def pops(drafts, target_choice):
        n = 0
        while drafts and drafts.pop(0) == target_choice.pop(0):
            n += 1
        return n

    literal = [((list(d), list(c)), want) for (d, c), want in grading_checks.VERIFY_LITERAL]
    checks = list(itertools.islice(grading_checks.verify_checks(pops), len(literal)))
    assert [check() for _, check in checks] == [None] * len(literal)
    assert grading_checks.VERIFY_LITERAL == literal
    assert grading_checks.VERIFY_LITERAL[0] == (([1, 2, 3], [1, 2, 3, 9]), 3)



# ---------------------------------------------------------------- 07 paged keys (grading_paged.py)
def test_paged_gets_a_copy_of_the_block_table_so_one_that_clears_it_leaves_the_cases():
    """A right answer that clears its block table passes, and the literal tables are as they were."""
    from wmtp.grading_paged import PAGED_LITERAL, library_addresses, paged_checks

    def clears(block_table, page_size, t, n_sink, window):
        addresses = library_addresses(list(block_table), page_size, t, n_sink, window)
        block_table.clear()
        return addresses

    tables = [list(args[0]) for args, _ in PAGED_LITERAL]
    checks = list(itertools.islice(paged_checks(clears, 0), len(PAGED_LITERAL)))
    assert [check() for _, check in checks] == [None] * len(PAGED_LITERAL)
    assert [args[0] for args, _ in PAGED_LITERAL] == tables
    assert PAGED_LITERAL[0][0][0] == [5, 2, 7, 0]



# ---------------------------------------------------------------- 08 draft depth (grading_depth.py)
def test_depth_that_adds_the_alphas_is_told_so_where_adding_without_the_target_token_picks_otherwise():
    """alphas [0.3, 0.9, 0.5], costs [1.0, 1.3, 1.6]: rates 1.3, 1.208, 1.066 (depth 1); added with the
    target's token 1.3, 1.692, 1.688 (depth 2); added without it 0.3, 0.923, 1.063 (depth 3)."""
    from wmtp.grading_depth import _hint

    assert _hint(2, 1, [0.3, 0.9, 0.5], [1.0, 1.3, 1.6]) == (
        " (draft i counts only if drafts 1 .. i-1 were accepted: multiply the alphas, do not add them)")
