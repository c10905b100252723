"""Assignment 01: the draft key set of Windowed-MTP.

Windowed-MTP (arXiv 2607.21535, Sec. 3) lets the MTP draft head attend only to the first
``n_sink`` tokens (attention sinks) plus the most recent ``window`` tokens; the target still
verifies with full attention, so the window can change how many drafts are accepted but never
the output. ``docs/concepts.md#the-key-set`` defines the key set: a draft query at absolute
position ``t`` (0-based; its own key is at ``t``) may read key ``j`` iff

    j <= t  and  ( j < n_sink  or  j > t - window )

So ``window`` counts the query's own key, and the set holds ``min(t + 1, n_sink + window)`` keys.
``window=None`` means the full causal set ``0 .. t``; ``n_sink=0`` is a pure sliding window.

Example: ``draft_key_indices(19, n_sink=2, window=6) == [0, 1, 14, 15, 16, 17, 18, 19]``.

Watch for: a key that is both a sink and in the window is read once, not twice; and the window
of 6 keys ending at 19 starts at 14, not 13.

Your task: implement ``draft_key_indices`` below (plain Python, no torch needed).

Grade it:

    wmtp grade keyset tutorials/assignments/01_keyset.py

The grader checks literal key sets first (every regime: t+1 <= n_sink, the ranges touching,
a gap, n_sink=0, window=1, window=None), then 300 fuzzed cases against ``wmtp.keyset``, and
prints the first failing case with what it expected and what you returned.
"""

from __future__ import annotations


def draft_key_indices(t: int, n_sink: int, window: int | None) -> list[int]:
    """Key positions the draft query at position ``t`` may read, ascending, each once.

    Args:
        t: absolute query position (0-based).
        n_sink: number of attention-sink keys at the start (>= 0).
        window: number of recent keys including the query's own (>= 1), or None for all of 0..t.

    Returns:
        The key positions as a list of ints, ascending.
    """
    raise NotImplementedError
