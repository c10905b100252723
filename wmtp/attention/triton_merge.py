"""The log-sum-exp merge of split-K partials, in Triton (arXiv 2607.21535, Sec. 3: flash-decoding).

``_attention_kernel`` (attention/triton_attention.py) cuts a tile's key blocks into ``n_splits``
runs; each program leaves, per real tile row, the running max ``m`` (log2 domain), the
denominator ``l`` and the unnormalised sum ``acc`` (D values) of its run. The output row is

    out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s,   M = max_s m_s,

with an empty split (``m = -inf, l = 0``) weighing nothing and a row without keys coming out zero.
``merge_splits`` computes it online over chunks of splits, the same rescaling as the attention
loop, so a chunk's m, l and acc loads are issued together: one memory round trip per chunk.
NOTE [PDL] in attention/triton_attention.py says how the merge launch overlaps the attention grid.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import triton
import triton.language as tl

from .launch import CachedLaunch, fast_launches

__all__ = ["MergeCall", "launch_merge", "merge_splits"]


@triton.jit
def _tile_rows(pid_bh, rows, Lq, n_queries, GROUP: tl.constexpr, CHUNKED: tl.constexpr):
    """Program ``pid_bh``'s (batch * kv head) and each tile row's query index and realness (NOTE [Chunks])."""
    if CHUNKED:  # pid_bh = chunk slot * (B * Hkv) + batch * Hkv + kv head; slot 0 holds the LAST chunk
        n_chunks = tl.cdiv(n_queries, Lq)
        n_bh = tl.num_programs(0) // n_chunks
        qi = (n_chunks - 1 - pid_bh // n_bh) * Lq + rows % Lq  # (R,) the chunk's Lq queries
        real = (rows < GROUP * Lq) & (qi < n_queries)
        return pid_bh % n_bh, tl.minimum(qi, n_queries - 1).to(tl.int64), real  # padding repeats a real query
    else:
        return pid_bh, rows % Lq, rows < GROUP * Lq


@triton.jit
def _merge_kernel(
    WS,  # partials written by _attention_kernel, one flat workspace: m, l (n_rows each), acc (n_rows * D)
    Out,  # (B, Hq, n_queries, D) output in q.dtype
    stride_ob, stride_oh, stride_ol, stride_od,
    Hkv, Lq, n_splits, n_rows, n_queries,  # n_rows = grid axis 0 * n_splits * BLOCK_M; Lq, n_queries: the kernel's
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, PDL: tl.constexpr, CHUNKED: tl.constexpr,  # CHUNKED: NOTE [Chunks], as the kernel's
):
    """One program per (attention program of axis 0, tile row, slice of ``BLOCK_D`` of the head
    dim): the log-sum-exp merge of the row's ``n_splits`` partials, online over chunks of
    ``SPLIT_CHUNK`` splits whose m, l and acc loads are issued together (one memory round trip per
    chunk; the draft's splits fit one chunk). A tile row is real but for the last query chunk's
    padding rows (NOTE [Chunks]), which load and store nothing."""
    if PDL:  # NOTE [PDL]: launched early; wait until the attention grid has finished and its writes are visible
        tl.extra.cuda.gdc_wait()
    PM, PL, PACC = WS, WS + n_rows, WS + n_rows + n_rows  # (grid axis 0, n_splits, BLOCK_M[, D]) views of WS
    pid_bh = tl.program_id(0)  # the attention program's axis 0: (batch * kv head), or with CHUNKED (chunk, b, head)
    row = tl.program_id(1)  # a row of the tile: query head kvh * GROUP + row // Lq, query row % Lq of its chunk
    offs_s = tl.arange(0, SPLIT_CHUNK)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    base = pid_bh.to(tl.int64) * n_splits * BLOCK_M + row  # this row in split 0; split s at base + s * BLOCK_M
    bh, qi, real = _tile_rows(pid_bh, row, Lq, n_queries, GROUP, CHUNKED)  # qi, real: this row's query
    m_run = tl.full([], float("-inf"), PM.dtype.element_ty)
    l_run = tl.zeros([], PM.dtype.element_ty)
    acc = tl.zeros([BLOCK_D], PM.dtype.element_ty)
    for c in range(0, n_splits, SPLIT_CHUNK):  # an empty (or masked) split has m = -inf: weight 0
        s = c + offs_s  # (SPLIT_CHUNK,)
        ok = s < n_splits
        if CHUNKED:  # a padding row has no partials: it loads nothing (m = -inf, l = 0) and stores nothing
            ok = ok & real
        m = tl.load(PM + base + s * BLOCK_M, mask=ok, other=float("-inf"))  # (SPLIT_CHUNK,)
        den = tl.load(PL + base + s * BLOCK_M, mask=ok, other=0.0)  # (SPLIT_CHUNK,)
        part = tl.load(PACC + (base + s * BLOCK_M)[:, None] * HEAD_DIM + offs_d[None, :],
                       mask=ok[:, None], other=0.0)  # (SPLIT_CHUNK, BLOCK_D)
        m_new = tl.maximum(m_run, tl.max(m, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        w = tl.math.exp2(m - m_use)  # (SPLIT_CHUNK,)
        alpha = tl.math.exp2(m_run - m_use)
        l_run = l_run * alpha + tl.sum(w * den, 0)
        acc = acc * alpha + tl.sum(w[:, None] * part, 0)  # (BLOCK_D,)
        m_run = m_new
    out = acc / tl.where(l_run == 0.0, 1.0, l_run)  # (BLOCK_D,)
    b, kvh = bh // Hkv, bh % Hkv
    o_off = b.to(tl.int64) * stride_ob + (kvh * GROUP + row // Lq).to(qi.dtype) * stride_oh + qi * stride_ol
    if CHUNKED:  # the last chunk's padding rows have no query
        tl.store(Out + o_off + offs_d * stride_od, out.to(Out.dtype.element_ty), mask=real)
    else:
        tl.store(Out + o_off + offs_d * stride_od, out.to(Out.dtype.element_ty))


@functools.lru_cache(maxsize=1024)
def _merge_plan(out_shape, out_stride, Hkv: int, block_m: int, num_splits: int, pdl: bool, max_chunk: int,
                tile_queries: int | None = None):
    """The merge launch's grid, int arguments and keywords, computed once per distinct key (and once
    per attention plan: attention/triton_plan.py keeps them with its own). ``tile_queries``: the
    queries of one tile, fewer than the output's with NOTE [Chunks] (``None``: all of them)."""
    if max_chunk < 1 or max_chunk & (max_chunk - 1):
        raise ValueError(f"max_chunk must be a power of two, got {max_chunk}")
    B, Hq, Lq, D = out_shape  # (B, Hq, Lq, D)
    if D < 16 or D & (D - 1):  # a slice of BLOCK_D would leave D's last columns unmerged, unwritten
        raise ValueError(f"the merge takes a head dim that is a power of two >= 16, got {D}")
    Lc = Lq if tile_queries is None else tile_queries
    n_bh = -(-Lq // Lc) * B * Hkv  # the attention grid's axis 0: (query chunk,) batch, kv head
    chunk = min(triton.next_power_of_2(num_splits), max_chunk)
    block_d = min(D, max(16, 4096 // chunk))
    kwargs = dict(GROUP=Hq // Hkv, BLOCK_M=block_m, SPLIT_CHUNK=chunk, HEAD_DIM=D, BLOCK_D=block_d, PDL=pdl,
                  CHUNKED=Lc < Lq, num_warps=4, **({"launch_pdl": True} if pdl else {}))  # launch_pdl: NVIDIA's only
    ints = (*out_stride, Hkv, Lc, num_splits, n_bh * num_splits * block_m, Lq)
    return (n_bh, Hq // Hkv * Lc, D // block_d), ints, MappingProxyType(kwargs)


_MERGE = CachedLaunch(_merge_kernel)  # NOTE [Launch cache] in attention/launch.py


class MergeCall(NamedTuple):
    """One launch of ``_merge_kernel``: what ``_merge_plan`` gives, with its two tensors (ws, out)."""

    grid: tuple[int, int, int]
    args: tuple  # ws, out, then Python ints
    kwargs: Mapping  # constexprs and launch options (read-only: cached)
    static: tuple  # _merge_plan's key, which fixes grid, kwargs and the ints; then ws's and out's dtypes


def launch_merge(call: MergeCall, keyed: int) -> None:
    """Launch one merge; the launch cache keys the alignment of its first ``keyed`` tensors (NOTE [Workspace])."""
    if fast_launches(call.args[1].device):
        _MERGE.launch(call.grid, call.args, call.kwargs, call.static, 2, keyed=keyed)
    else:
        _merge_kernel[call.grid](*call.args, **call.kwargs)


def merge_splits(ws, out, Hkv: int, block_m: int, num_splits: int, pdl: bool, max_chunk: int = 256,
                 tile_queries: int | None = None):
    """Launch ``_merge_kernel`` over the partials of ``num_splits`` splits into ``out`` ``(B, Hq, Lq, D)``.

    ``ws``: one contiguous workspace holding, with ``n = B * Hkv * num_splits * block_m``, the maxima
    ``m`` ``(B*Hkv, n_splits, block_m)`` in ``ws[:n]``, the denominators ``l`` (same shape) in
    ``ws[n:2n]`` and the sums ``acc`` ``(B*Hkv, n_splits, block_m, D)`` in ``ws[2n:]``, as
    ``_attention_kernel`` leaves them (``_launch`` launches the merge from its plan, not through
    this function; tests call it on their own partials). A program merges one row over a slice of
    ``min(D, max(16, 4096 // chunk))`` head dims with chunks of ``chunk = min(next_pow2(num_splits),
    max_chunk)`` splits: a launch of up to 256 splits (every draft; a verify unless ``B * Hkv`` is 1)
    merges in one memory round trip. Tests pass a small ``max_chunk`` to run the online path. With
    ``tile_queries`` below ``Lq`` (NOTE [Chunks] in attention/triton_attention.py) the leading
    ``B*Hkv`` is ``n_chunks * B * Hkv``, chunk slot first, the last chunk in slot 0.
    """
    static = (tuple(out.shape), out.stride(), Hkv, block_m, num_splits, pdl, max_chunk, tile_queries)
    grid, ints, kwargs = _merge_plan(*static)
    if not ws.is_contiguous() or ws.numel() != ints[-2] * (out.shape[-1] + 2):
        raise ValueError(f"ws must be contiguous m, l and acc: {ints[-2] * (out.shape[-1] + 2)} elements, got "
                         f"{ws.numel()}{'' if ws.is_contiguous() else ' (not contiguous)'}")
    launch_merge(MergeCall(grid, (ws, out, *ints), kwargs, (*static, ws.dtype, out.dtype)), keyed=2)
