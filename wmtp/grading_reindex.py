"""Assignment 05's checks (``wmtp grade reindexed``): ``sink_query_position``, the position a draft
query is rotated to when it scores the sinks under StreamingLLM-style re-indexed key positions
(wmtp/keyset.py; beyond arXiv 2607.21535, Sec. 3, which keeps absolute positions).

Checked in order (wmtp/grading.py runs them and stops at the first failure): literal positions
for each regime, ``wmtp.keyset.sink_query_position`` on fuzzed cases, and then what the formula is
for: attention whose sinks are scored from the student's position, against the compact re-indexed
cache itself (the key set gathered, its keys rotated to their index, the query to the last index),
in float64. A position off by one fails the literal cases of a slid window and moves the attention
by O(0.1).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterator

import torch

from .attention.reference import attention_torch
from .block import apply_rope
from .grading_checks import as_int
from .keyset import draft_key_indices, reindexed_key_positions, sink_query_position

__all__ = ["REINDEX_LITERAL", "reindex_checks"]

REINDEX_LITERAL = [  # (t, n_sink, window) -> position; the regimes of tests/test_positions.py
    ((19, 2, 6), 7),  # the window has slid: the sinks are seen from the set's last index, 2 + 6 - 1
    ((10, 4, 6), 9), ((9, 4, 6), 9),  # the first eviction, and the step before it: t itself
    ((7, 4, 6), 7), ((0, 4, 6), 0), ((3, 9, 2), 3),  # nothing evicted yet (or only sinks so far): t
    ((50, 1, 1), 1),  # one sink, a window of the query's own key: distance 1 to the sink
    ((100, 0, 6), 100), ((100, 4, None), 100),  # no sinks, or the full causal set: nothing moves
]
THETA, D = 10000.0, 16  # the attention check's RoPE base and head dim


def _position_case(fn, t: int, n_sink: int, window: int | None, expected: int) -> str | None:
    answer = fn(t, n_sink, window)
    got = as_int(answer)
    if got is None:
        return f"expected the int {expected}, got {answer!r}"
    if got == expected:
        return None
    hint = ""
    if window is not None and n_sink and got == min(t, n_sink + window):
        hint = " (the query sits at the LAST index of the key set, n_sink + window - 1, once it is full)"
    elif not n_sink or window is None:
        hint = " (without sinks, or without a window, nothing is re-indexed: the query stays at t)"
    elif got == t:
        hint = " (t is the query's absolute position; re-indexed, it sits at the last index of its key set)"
    elif expected == t:
        hint = f" (nothing is evicted while t < n_sink + window: the key set is still 0 .. {t}, the query its last key)"
    return f"expected {expected}, got {got}{hint}"


def _attention_case(fn, t: int, n_sink: int, window: int, seed: int) -> str | None:
    """The sinks scored from ``fn``'s position against the compact re-indexed cache, float64."""
    g = torch.Generator().manual_seed(seed)
    k_raw, v = torch.randn(2, 1, 1, t + 1, D, generator=g, dtype=torch.float64)  # (B, Hkv, S, D) each
    q_raw = torch.randn(1, 1, 1, D, generator=g, dtype=torch.float64)  # (B, Hq, 1, D)
    idx = draft_key_indices(t, n_sink, window)
    key_pos, query_pos = reindexed_key_positions(t, n_sink, window)
    k_set = apply_rope(k_raw[:, :, idx], key_pos, THETA)  # the compact cache, keys at 0 .. n-1
    q_set = apply_rope(q_raw, torch.tensor([query_pos]), THETA)
    expected = torch.softmax(q_set @ k_set.transpose(-1, -2) / math.sqrt(D), -1) @ v[:, :, idx]  # (1, 1, 1, D)
    answer = fn(t, n_sink, window)
    where = as_int(answer)
    if where is None:
        return f"expected the int position {query_pos}, got {answer!r}"
    pos = torch.tensor([t])
    q_sink = apply_rope(q_raw, torch.tensor([where]), THETA)
    got = attention_torch(apply_rope(q_raw, pos, THETA), apply_rope(k_raw, torch.arange(t + 1), THETA), v, pos,
                          n_sink, window, q_sink)
    err = (got - expected).abs().max().item()
    if err <= 1e-10:
        return None
    return (f"scoring the sinks from position {where} gives attention {err:.3g} away from the compact re-indexed "
            f"cache (the query at index {query_pos} of the {len(idx)} keys it reads)")


def reindex_checks(fn: Callable | None, n_fuzz: int) -> Iterator[tuple[str, Callable[[], str | None]]]:
    """The checks of ``sink_query_position`` (the student's function ``fn``), named, in order."""
    rng = random.Random(5)
    fuzz = [(rng.randrange(200), rng.randrange(9), rng.choice([None, *range(1, 40)])) for _ in range(n_fuzz)]
    for (t, n_sink, window), expected in REINDEX_LITERAL + [(a, sink_query_position(*a)) for a in fuzz]:
        yield (f"sink_query_position(t={t}, n_sink={n_sink}, window={window})",
               functools.partial(_position_case, fn, t, n_sink, window, expected))
    for i, (t, n_sink, window) in enumerate([(40, 4, 8), (12, 4, 8), (11, 4, 8), (30, 1, 1), (90, 8, 20), (7, 3, 2)]):
        yield (f"attention at t={t} with {n_sink} sinks and a window of {window}, sinks scored from "
               f"sink_query_position(t={t}, n_sink={n_sink}, window={window})",
               functools.partial(_attention_case, fn, t, n_sink, window, i))
