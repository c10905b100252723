"""Reference attention in plain PyTorch: the ground truth for every kernel (CPU, MPS, CUDA).

Implements ``attention(q, k, v, q_pos, n_sink, window)`` for the draft key set of Windowed-MTP
(arXiv 2607.21535, Sec. 3) and, with ``window=None``, for the target's full causal set. It never
reads a key outside the key set's two ranges (wmtp/keyset.py: the sink range and the recent
range), so its cost scales with the keys read, ``min(t + 1, n_sink + window)`` per query, not
with the cache length. That is the draft-KV saving the paper measures.

NOTE [Precision]: scores, softmax and the weighted sum run in ``promote_types(dtype, float32)``
(fp32 for fp16/bf16/fp32 inputs, fp64 for fp64 inputs); the output is cast back to ``q.dtype``.
Kernels accumulate in fp32 too (fp64 for fp64), so this mirrors their precision boundaries.
"""

from __future__ import annotations

import itertools

import torch

from ..keyset import in_key_set, key_ranges

BLOCK_Q = 256  # queries per block: bounds the (Lq, keys) score tile of a long prefill


def _query_blocks(q_pos: torch.Tensor) -> list[tuple[int, int]]:
    """Split queries into blocks of at most ``BLOCK_Q`` consecutive positions.

    Within such a block the union of the key sets is exactly two ranges (the sinks, and the
    recent range from the first query's window start to the last query), so no key outside
    every query's set is read. Queries at scattered positions get blocks of their own.
    """
    if q_pos.numel() == 1:
        return [(0, 1)]
    breaks = (torch.nonzero(q_pos[1:] - q_pos[:-1] != 1).flatten() + 1).tolist()
    blocks = []
    for a, b in zip([0] + breaks, breaks + [q_pos.numel()]):
        blocks += [(s, min(s + BLOCK_Q, b)) for s in range(a, b, BLOCK_Q)]
    return blocks


def attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    n_sink: int | None = None,
    window: int | None = None,
    q_sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sink+window (or full causal) attention for queries at absolute positions ``q_pos``.

    Args:
        q: ``(B, Hq, Lq, D)`` queries.
        k, v: ``(B, Hkv, S, D)`` keys and values indexed by absolute position (a KV cache);
            positions past ``max(q_pos)`` are never read, whatever they hold.
        q_pos: ``(Lq,)`` absolute positions of the queries, each ``< S``, or ``(B, Lq)``: each batch
            row's own (computed row by row, each row as a batch of one).
        n_sink: sink keys (``None`` = 0).
        window: recent keys including the query's own (``None`` = full causal set).
        q_sink: ``(B, Hq, Lq, D)`` queries that score the sink keys (``j < n_sink``) in place of
            ``q``: re-indexed positions (wmtp/keyset.py); ``None``: ``q`` scores every key.

    Returns:
        ``(B, Hq, Lq, D)`` in ``q.dtype``.
    """
    if q_pos.dim() == 2:  # positions per row: each row alone
        return torch.cat([attention_torch(q[b : b + 1], k[b : b + 1], v[b : b + 1], q_pos[b], n_sink, window,
                                          None if q_sink is None else q_sink[b : b + 1]) for b in range(q.shape[0])])
    B, Hq, Lq, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    acc = torch.promote_types(q.dtype, torch.float32)
    scale = D**-0.5
    blocks = _query_blocks(q_pos)
    out = torch.empty_like(q) if len(blocks) != 1 else None  # one block (a decode step): its output is out
    for start, stop in blocks:
        pos = q_pos[start:stop]  # (Lb,) consecutive positions lo..hi
        lo, hi = int(pos[0]), int(pos[-1])
        # Keys any query in [lo, hi] may read: the sinks of `hi`, then the recent range from lo's start.
        (_, sink_end), _ = key_ranges(hi, n_sink, window)
        _, (recent_start, _) = key_ranges(lo, n_sink, window)
        recent_start = max(recent_start, sink_end)  # disjoint ranges: no key counted twice
        keys = [(0, hi + 1)] if recent_start == sink_end else [(0, sink_end), (recent_start, hi + 1)]
        keys = [(a, b) for a, b in keys if b > a]  # the only key positions this block reads
        qb = q[:, :, start:stop].to(acc)  # (B, Hq, Lb, D)
        qb = qb.reshape(B, Hkv, group * len(pos), D)  # GQA: the query heads of one KV head together
        # Scores per range straight from the cache (views, no copy of K or V), then one softmax.
        scores = torch.cat([qb @ k[:, :, a:b].to(acc).transpose(-1, -2) for a, b in keys], -1) * scale
        if q_sink is not None and sink_end:  # the first sink_end columns are the sinks, in both layouts
            qs = q_sink[:, :, start:stop].to(acc).reshape(B, Hkv, group * len(pos), D)  # (B, Hkv, group*Lb, D)
            scores[..., :sink_end] = qs @ k[:, :, :sink_end].to(acc).transpose(-1, -2) * scale
        if len(pos) > 1:  # one query reads exactly its ranges' keys; a block needs the formula
            key_pos = torch.cat([torch.arange(a, b, device=q.device) for a, b in keys])  # (Kn,)
            allowed = in_key_set(pos[:, None], key_pos[None, :], n_sink, window)  # (Lb, Kn)
            scores = scores.view(B, Hkv, group, len(pos), -1).masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(B, Hkv, group * len(pos), -1)  # (B, Hkv, group*Lb, Kn)
        offsets = [0] + [b - a for a, b in keys]
        parts = [probs[..., o : o + b - a] @ v[:, :, a:b].to(acc)  # (B, Hkv, group*Lb, D) per range
                 for o, (a, b) in zip(itertools.accumulate(offsets), keys)]
        ob = sum(parts[1:], start=parts[0]).view(B, Hq, len(pos), D).to(q.dtype)  # (B, Hq, Lb, D)
        if out is None:
            return ob
        out[:, :, start:stop] = ob
    return out
