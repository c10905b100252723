"""Assignment 05: where a draft query sits when the key set's positions are re-indexed.

Windowed-MTP's draft reads the first ``n_sink`` keys and the last ``window`` ones (arXiv
2607.21535, Sec. 3), each at the RoPE of its absolute position. StreamingLLM re-indexes instead:
inside the key set, key ``i`` (ascending) sits at position ``i``, and the query at the set's last
index. With RoPE a score depends only on the distance between query and key, so the recent keys
keep their distances (they shift with the query) and only the sinks move. wmtp therefore scores the
sink keys with the query rotated to one position, ``sink_query_position(t, n_sink, window)``, and
needs no second cache (``docs/concepts.md#re-indexed-key-positions``; tutorial 08).

Your task: implement ``sink_query_position`` below (plain Python): the position to rotate the
query at absolute position ``t`` to when it scores the sinks, which is its index in the re-indexed
key set (the set's last index). Think about when the key set is still the whole prefix ``0 .. t``
(nothing evicted). Without sinks (``n_sink == 0``) or without a window (``window is None``: the full
causal set) no score changes under re-indexing (a pure window shifts with the query; the full set
is never evicted), so there is nothing to re-index and the answer is ``t`` itself, as in
``wmtp.keyset.sink_query_position``. You need not validate arguments.

Grade it:

    wmtp grade reindexed tutorials/assignments/05_reindexed_positions.py

The grader checks literal positions, 300 fuzzed cases against ``wmtp.keyset.sink_query_position``,
and then attention whose sinks are scored from your position against the compact re-indexed cache
itself, in float64.
"""

from __future__ import annotations


def sink_query_position(t: int, n_sink: int, window: int | None) -> int:
    """The re-indexed position of the draft query at absolute position ``t``.

    Args:
        t: absolute query position (>= 0); the key set is ``j <= t and (j < n_sink or j > t - window)``.
        n_sink: sink keys (>= 0).
        window: recent keys including the query's own (>= 1), or ``None`` for the full causal set.

    Returns:
        The query's position once the key set's keys are re-indexed ``0, 1, 2, ...``; ``t`` when there
        is nothing to re-index (``n_sink == 0`` or ``window is None``).
    """
    raise NotImplementedError
