"""Assignment 04's checks (``wmtp grade splitk_merge``): ``merge_splits``, the log-sum-exp merge of
flash-decoding partials that the split-K kernels run (wmtp/attention/triton_merge.py; arXiv
2607.21535, Sec. 4's long-context draft and verify attention).

Checked in order (wmtp/grading.py runs them and stops at the first failure): literal splittings
(one split, two, empty splits, scores in the hundreds), then fuzzed ones; each compares the merge of
the partials with ``softmax(s) @ v`` over all keys at once, in float64. A wrong answer is matched
against the usual wrong merges (no rescale, l left unscaled, no division, an unweighted mean of the
splits' outputs) to name the mistake.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator

import torch

from .grading_checks import N_FUZZ

__all__ = ["MERGE_LITERAL", "merge_checks", "split_partials"]

# The merge is a few exps and sums in float64 (rounding ~1e-15); a missed rescale is wrong by O(1).
MERGE_RTOL, MERGE_ATOL = 1e-9, 1e-12
MERGE_LITERAL = [  # (scores, split sizes, scale): 0 = an empty split
    ([0.5, -1.0, 2.0], [3], 1.0), ([0.5, -1.0, 2.0, 0.0], [2, 2], 1.0), ([1.0, 1.0], [1, 1], 1.0),
    ([0.3, 2.0, -0.7], [0, 2, 1], 1.0), ([0.3, 2.0, -0.7], [1, 0, 2, 0], 1.0), ([1.0, -2.0, 0.5], [1, 2], 900.0),
]


def split_partials(s: torch.Tensor, v: torch.Tensor, sizes: list[int]):
    """Flash-decoding partials of keys split in consecutive runs of ``sizes``: ``m, l, acc``."""
    m, den, acc = [], [], []
    for part_s, part_v in zip(s.split(sizes), v.split(sizes)):
        mi = part_s.max() if len(part_s) else torch.tensor(float("-inf"), dtype=s.dtype)
        w = (part_s - mi).exp()  # (n_i,)
        m.append(mi)
        den.append(w.sum())
        acc.append(w @ part_v)  # (D,)
    return torch.stack(m), torch.stack(den), torch.stack(acc)  # (n_splits,), (n_splits,), (n_splits, D)


def _wrong_merges(m, den, acc) -> list[tuple[torch.Tensor, str]]:
    """The usual wrong merges of the partials, each with the hint that names its mistake."""
    live = den > 0  # (n_splits,) the splits with keys
    scale = (m - m[live].max()).exp() * live  # (n_splits,) exp(m_i - max m), 0 for an empty split
    outs = acc[live] / den[live, None]  # (n_live, D) each split's own softmax output
    return [
        (acc.sum(0) / den.sum(), "each split's l and acc are relative to its own max m_i: rescale by "
                                 "exp(m_i - max m)"),
        ((scale[:, None] * acc).sum(0) / den.sum(), "acc was rescaled by exp(m_i - max m) but l was not: the "
                                                    "denominator is sum_i exp(m_i - max m) * l_i"),
        ((scale[:, None] * acc).sum(0), "the rescaled acc's sum is not yet divided by the rescaled l's sum"),
        (outs.mean(0), "an unweighted mean of the splits' outputs acc_i / l_i: weight each by its share of the "
                       "softmax mass, exp(m_i - max m) * l_i"),
    ]


def _merge_case(fn, s, v, sizes) -> str | None:
    m, den, acc = split_partials(s, v, sizes)
    expected = torch.softmax(s, 0) @ v  # (D,) attention over all keys at once, float64
    got = fn(m.clone(), den.clone(), acc.clone())
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return f"expected a tensor of shape {tuple(expected.shape)}, got {got!r}"
    if torch.allclose(got.double(), expected, rtol=MERGE_RTOL, atol=MERGE_ATOL):
        return None
    if got.dtype != torch.float64:
        hint = f" (a {got.dtype} result: the partials are float64, keep them so to match to 1e-9)"
    elif not got.isfinite().all() and m.isinf().any():
        hint = " (NaN: an empty split has m=-inf, l=0, acc=0; it must contribute nothing)"
    elif not got.isfinite().all():
        hint = " (NaN or inf with no empty split: exp of scores in the hundreds overflows; exponentiate m_i - max m)"
    else:
        named = [why for wrong, why in _wrong_merges(m, den, acc)
                 if torch.allclose(got, wrong, rtol=MERGE_RTOL, atol=MERGE_ATOL)]
        hint = f" ({named[0]})" if named else (" (the merge is sum_i exp(m_i - max m) * acc_i over "
                                               "sum_i exp(m_i - max m) * l_i)")
    return f"m={m.tolist()}, l={den.tolist()}: expected {expected.tolist()}, got {got.tolist()}{hint}"


def merge_checks(fn: Callable) -> Iterator[tuple[str, Callable[[], str | None]]]:
    """The literal splittings, then ``N_FUZZ // 3`` fuzzed ones (seeded: every student gets the same)."""
    g, rng = torch.Generator().manual_seed(3), random.Random(3)
    cases = [(torch.tensor(s, dtype=torch.float64) * scale, sizes, 2) for s, sizes, scale in MERGE_LITERAL]
    for _ in range(N_FUZZ // 3):
        sizes = [rng.choice([0, 0, 1, 2, 3, 5]) for _ in range(rng.randrange(1, 7))]
        sizes[rng.randrange(len(sizes))] += 1  # at least one key
        s = torch.randn(sum(sizes), generator=g, dtype=torch.float64) * rng.choice([1.0, 10.0, 1000.0])
        cases.append((s, sizes, rng.randrange(1, 5)))
    for s, sizes, d in cases:
        v = torch.randn(len(s), d, generator=g, dtype=torch.float64)  # (N, D)
        yield (f"merge_splits of scores s={[round(x, 3) for x in s.tolist()]} split into runs of {sizes} keys "
               f"(D={d})", functools.partial(_merge_case, fn, s, v, sizes))
