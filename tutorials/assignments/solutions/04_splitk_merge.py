"""Reference solution to assignment 04: the split-K (flash-decoding) merge.

At long context the draft query's keys (``j <= t and (j < n_sink or j > t - window)``,
``docs/concepts.md#the-key-set``; arXiv 2607.21535, Sec. 3) are too many for one GPU program, so
the Triton kernel (wmtp/attention/triton_attention.py) cuts them into ``n_splits`` runs and each
program keeps partials over its own keys only. With scores ``s`` and values ``v``, split ``i`` stores

    m_i   = max of its scores s                       (-inf if the split has no keys)
    l_i   = sum over its keys of exp(s - m_i)          (0 if empty)
    acc_i = sum over its keys of exp(s - m_i) * v      (a zero vector if empty)

Your task: merge them into the attention output over ALL keys, ``softmax(s) @ v``, which is

    out = sum_i exp(m_i - m) * acc_i  /  sum_i exp(m_i - m) * l_i,   with m = max_i m_i

(the log-sum-exp rescale: each split's sums are relative to its own max). Make it robust:
scores can be in the hundreds (exp(s) alone overflows) and a split can be empty (0/0 is NaN).
Use torch; the partials are float64 and your answer must match to ~1e-9.

Grade it:

    wmtp grade splitk_merge tutorials/assignments/04_splitk_merge.py

The grader draws raw scores and values, splits them (empty splits included), computes the
partials, and compares your merge with softmax(s) @ v computed directly in float64.
"""

from __future__ import annotations

import torch


def merge_splits(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:  # noqa: E741
    """Attention output over all keys from per-split partials.

    Args:
        m: (n_splits,) max score of each split (-inf for an empty split).
        l: (n_splits,) sum of exp(s - m_i) over the split's keys.
        acc: (n_splits, D) sum of exp(s - m_i) * v over the split's keys.

    Returns:
        (D,) the attention output softmax(s) @ v.
    """
    scale = torch.exp(m - m.max())  # (n_splits,) exp(m_i - m); 0 for an empty split (m_i = -inf)
    return (scale[:, None] * acc).sum(0) / (scale * l).sum()  # (D,)
