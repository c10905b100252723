"""Reference attention in plain PyTorch: the ground truth for every kernel (CPU, MPS, CUDA).

Implements ``attention(q, k, v, q_pos, n_sink, window)`` for the draft key set of Windowed-MTP
(arXiv 2607.21535, Sec. 3) and, with ``window=None``, for the target's full causal set. It never
reads a key outside the key set's two ranges (wmtp/keyset.py: the sink range and the recent
range), so its cost scales with the keys read, ``min(t + 1, n_sink + window)`` per query, not
with the cache length. That is the draft-KV saving the paper measures.

NOTE [Reference precision]: scores, softmax and the weighted sum run in ``promote_types(dtype, float32)``
(fp32 for fp16/bf16/fp32 inputs, fp64 for fp64 inputs); the output is cast back to ``q.dtype``.
Kernels accumulate in fp32 too (fp64 for fp64), so this mirrors their precision boundaries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

import torch

from ..keyset import in_key_set, key_ranges

if TYPE_CHECKING:
    from .paged import PagedView

Cache = Union[torch.Tensor, "PagedView"]  # (B, Hkv, S, D) keys or values, or a paged cache's view of them
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
    if Lq == 1:  # a decode step: one query, one block (and one int from the positions, not two)
        t = int(q_pos)
        return _attend_block(q, k, v, q_sink, q_pos, t, t, n_sink, window)
    blocks = _query_blocks(q_pos)
    out = torch.empty_like(q) if len(blocks) != 1 else None  # one block (a verify): its output is out
    for start, stop in blocks:
        pos = q_pos[start:stop]  # (Lb,) consecutive positions lo..hi
        lo, hi = pos[[0, -1]].tolist()
        qs = None if q_sink is None else q_sink[:, :, start:stop]
        ob = _attend_block(q[:, :, start:stop], k, v, qs, pos, lo, hi, n_sink, window)  # (B, Hq, Lb, D)
        if out is None:
            return ob
        out[:, :, start:stop] = ob
    return out


def _attend_block(q: torch.Tensor, k: Cache, v: Cache, q_sink: torch.Tensor | None, pos: torch.Tensor, lo: int,
                  hi: int, n_sink: int | None, window: int | None) -> torch.Tensor:
    """One block of queries at the consecutive positions ``pos`` (``lo .. hi``): ``(B, Hq, Lb, D)``.

    NOTE [Batched matmuls]: each ``(B, H, L, D)`` operand is flattened to ``(B * H, L, D)`` and
    multiplied with ``torch.bmm``, what ``@`` on 4-D tensors does inside, minus its broadcasting
    bookkeeping: a one-query call at 72 keys went from 46 ATen ops to 21 (experiment 52) and, on a
    2-core CPU, from 80.0 to 49.3 µs (experiment 50; both in metrics/README.md). The flatten is a
    view of the cache whenever its batch and head dims merge (always for a batch of one); otherwise
    it copies only the range's positions, never the cache. A range in another dtype than ``acc``
    (fp16, bf16) is a copy anyway, made once.
    """
    B, Hq, Lb, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    acc = torch.promote_types(q.dtype, torch.float32)
    # Keys any query in [lo, hi] may read: the sinks of `hi`, then the recent range from lo's start.
    (_, sink_end), _ = key_ranges(hi, n_sink, window)
    _, (recent_start, _) = key_ranges(lo, n_sink, window)
    recent_start = max(recent_start, sink_end)  # disjoint ranges: no key counted twice
    keys = [(0, hi + 1)] if recent_start == sink_end else [(0, sink_end), (recent_start, hi + 1)]
    keys = [(a, b) for a, b in keys if b > a]  # the only key positions this block reads
    # GQA: the query heads of one KV head together, one matrix per (batch, KV head).
    qb = _queries(q, acc, B * Hkv)  # (B*Hkv, group*Lb, D)
    ks = _ranges(k, keys, acc)  # (B*Hkv, b-a, D) per range: views of K where NOTE [Batched matmuls] allows
    # Scores per range straight from the cache, then one softmax over all of them.
    scores = [torch.bmm(qb, kr.mT) for kr in ks]  # (B*Hkv, group*Lb, b-a) each
    scores = (torch.cat(scores, -1) if len(scores) > 1 else scores[0]).mul_(D**-0.5)  # (B*Hkv, group*Lb, Kn)
    if q_sink is not None and sink_end:  # the first sink_end columns are the sinks, in both layouts
        qs = _queries(q_sink, acc, B * Hkv)  # (B*Hkv, group*Lb, D)
        scores[..., :sink_end] = torch.bmm(qs, ks[0][:, :sink_end].mT).mul_(D**-0.5)  # ranges start at key 0
    if Lb > 1:  # one query reads exactly its ranges' keys; a block needs the formula
        key_pos = torch.cat([torch.arange(a, b, device=q.device) for a, b in keys])  # (Kn,)
        allowed = in_key_set(pos[:, None], key_pos[None, :], n_sink, window)  # (Lb, Kn)
        scores = scores.view(B * Hkv, group, Lb, -1).masked_fill(~allowed, float("-inf")).view(B * Hkv, group * Lb, -1)
    probs = torch.softmax(scores, dim=-1)  # (B*Hkv, group*Lb, Kn)
    per_range = probs.split_with_sizes([b - a for a, b in keys], -1)  # (B*Hkv, group*Lb, b-a) each
    parts = [torch.bmm(p, vr) for p, vr in zip(per_range, _ranges(v, keys, acc))]  # (B*Hkv, group*Lb, D) each
    out = parts[0] if len(parts) == 1 else parts[0].add_(parts[1])
    out = out.view(B, Hq, Lb, D)  # (B, Hq, Lb, D)
    return out if out.dtype == q.dtype else out.to(q.dtype)


def _queries(q: torch.Tensor, acc: torch.dtype, rows: int) -> torch.Tensor:
    """``(B, Hq, Lb, D)`` queries as ``(B * Hkv, group * Lb, D)`` in ``acc``: one KV head's query heads together."""
    q = q.reshape(rows, -1, q.shape[-1])  # (B*Hkv, group*Lb, D)
    return q if q.dtype == acc else q.to(acc)


def _ranges(x: Cache, keys: list[tuple[int, int]], acc: torch.dtype) -> list[torch.Tensor]:
    """Positions ``[a, b)`` of a ``(B, H, S, D)`` cache for each range in ``keys``, as ``(B * H, b - a, D)``
    in ``acc`` (NOTE [Batched matmuls])."""
    if isinstance(x, torch.Tensor) and (x.shape[0] == 1 or x.shape[1] == 1 or x.stride(0) == x.shape[1] * x.stride(1)):
        x = x.flatten(0, 1)  # (B*H, S, D): a view, so each slice is one too
        rows = [x[:, a:b] for a, b in keys]  # (B*H, b-a, D) each
        return [r if r.dtype == acc else r.to(acc) for r in rows]
    # A PagedView (wmtp/attention/paged.py), or dims that do not merge: each range's positions alone,
    # cast before the flatten so that a range in another dtype is copied once, not twice.
    return [x[:, :, a:b].to(acc, memory_format=torch.contiguous_format).flatten(0, 1) for a, b in keys]  # (B*H, b-a, D)
