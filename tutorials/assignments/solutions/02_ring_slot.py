"""Reference solution to assignment 02: the slot of a position in the draft-KV ring buffer.

With a window, the draft head never reads most of the context (arXiv 2607.21535, Sec. 3), so its
KV cache need not hold it: a compact ring buffer of ``n_sink + window + depth`` slots suffices.
The sinks are pinned to their own slots and the other positions rotate through the rest.
``docs/concepts.md#the-ring-buffer-slot`` gives the slot of absolute position ``p``:

    slot(p) = p                                          if p < n_sink
              n_sink + (p - n_sink) mod (window + depth)  otherwise

Reads and writes use this one function. Why ``window + depth`` rotating slots? A draft query at
position ``t`` reads the sinks and the keys ``t-window+1 .. t``, while up to ``depth`` speculative
positions ``t+1 .. t+depth`` may already have been written. Those ``window + depth`` positions are
consecutive, so they land in distinct slots, and nothing the query reads has been overwritten.

Your task: implement ``ring_slot`` below (plain Python). You need not validate arguments
(the library's ``wmtp.kvcache.ring_slot`` does).

Grade it:

    wmtp grade ring_slot tutorials/assignments/02_ring_slot.py

The grader checks literal slots, 300 fuzzed cases against ``wmtp.kvcache.ring_slot``, and then
simulates a stream of writes and reads: every key a query reads must still be in its slot.
"""

from __future__ import annotations


def ring_slot(p: int, n_sink: int, window: int, depth: int) -> int:
    """Ring-buffer slot of absolute position ``p``.

    Args:
        p: absolute token position (>= 0).
        n_sink: number of pinned sink slots (>= 0).
        window: draft window, counting the query's own key (>= 1).
        depth: draft tokens per speculative step (>= 0).

    Returns:
        The slot, in ``0 .. n_sink + window + depth - 1``.
    """
    if p < n_sink:
        return p  # sinks are pinned: never overwritten
    return n_sink + (p - n_sink) % (window + depth)
