"""SpecStats (wmtp/stats.py) on its own, worked by hand: a generation of no steps, counters given to
the constructor, and ``to_dict``'s every key with its literal value. Added in mutation round 7,
part d: dividing by ``proposed`` or ``steps`` unguarded, dropping the ``per_position_accepted``
handed to the constructor, and ``to_dict`` losing ``draft_keys_read`` each survived the decode
loops' tests."""

from __future__ import annotations

from wmtp.stats import SpecStats


def test_a_generation_of_no_steps_reports_zeros_not_a_division_by_zero():
    s = SpecStats(3)
    assert s.acceptance_rate == 0.0 and s.mean_accept_length == 0.0
    assert s.per_position_acceptance == [0.0, 0.0, 0.0]
    assert s.accept_length_histogram == [0, 0, 0, 0] and s.steps_by_depth == [0, 0, 0, 0]


def test_counters_given_to_the_constructor_are_kept():
    """Lists passed in are the stats' own (only empty ones are filled with zeros); a step adds to them."""
    s = SpecStats(2, steps=4, accepted=4, proposed=8, per_position_accepted=[3, 1],
                  accept_length_histogram=[1, 2, 1], steps_by_depth=[0, 0, 4])
    assert s.per_position_acceptance == [0.75, 0.25]
    s.add_step(2, 0.5, 1.5)
    assert s.per_position_accepted == [4, 2] and s.accept_length_histogram == [1, 2, 2]
    assert s.steps_by_depth == [0, 0, 5] and (s.steps, s.proposed, s.accepted) == (5, 10, 6)
    assert s.per_position_acceptance == [0.8, 0.4] and s.acceptance_rate == 0.6


def test_to_dict_holds_every_counter_and_ratio():
    s = SpecStats(2, committed=7, draft_keys_read=40, draft_queries=9, draft_kv_bytes=512)
    s.add_step(1, 0.25, 1.0)
    s.add_step(2, 0.5, 2.0, depth=2)
    s.add_step(0, 0.75, 3.0, depth=1)
    assert s.to_dict() == {
        "depth": 2, "proposed": 5, "accepted": 3, "committed": 7, "steps": 3,
        "accept_length_histogram": [1, 1, 1], "steps_by_depth": [0, 1, 2],
        "draft_keys_read": 40, "draft_kv_bytes": 512, "draft_queries": 9,
        "draft_times_s": [0.25, 0.5, 0.75], "verify_times_s": [1.0, 2.0, 3.0],
        "acceptance_rate": 0.6, "mean_accept_length": 7 / 3, "per_position_acceptance": [2 / 3, 1 / 3]}
