"""The Triton kernels' launch, planned on the host from shapes and Python ints (arXiv 2607.21535, Sec. 3).

``plan_call`` turns one call of ``attention_triton`` / ``paged_attention_triton``
(attention/triton_attention.py) into ``_attention_kernel``'s grid, arguments and constexprs, and
the merge's launch. Everything but the tensors follows from shapes, strides, dtype, the key set
and the launch overrides, so ``_static_plan`` computes it once per distinct key (an LRU cache) and
``plan_call`` only allocates the output and the split workspace; the key doubles as the launch
cache's (NOTE [Launch cache] in attention/launch.py). NOTE [Launch] in
attention/plan.py says how the launch is chosen (``launch_config``);
NOTE [Host sync] why no device value is read here.

NOTE [Workspace]: with split-K the partials live in ONE allocation, ``m | l | acc`` (``n_rows``
maxima, ``n_rows`` denominators, ``n_rows * D`` sums, ``n_rows = n_chunks * B * Hkv * n_splits *
BLOCK_M``, ``n_chunks`` 1 but for NOTE [Chunks] in attention/triton_attention.py),
passed to both kernels as one pointer that each offsets by ``n_rows``: one allocation and one
launch argument instead of a split into three views (host time: the draft is a few microseconds of
device time). ``n_rows`` is a multiple of 16, so every part starts 64-byte aligned. The output and
the workspace are this call's fresh allocations, whose dtypes the static key fixes; the launch
cache keys only the caller's tensors' alignment, so ``plan_call`` asserts that the allocator's
blocks are 16-byte aligned (PyTorch's CUDA caching allocator: 512 bytes; its CPU allocator: 64).
The merge's launch is planned with the attention's, in ``_static_plan``.

NOTE [Output layout]: the output ``(B, Hq, Lq, D)`` lives in ``(B, Lq, Hq, D)`` memory, a query's
heads side by side, as the model's output projection reads them: ``y.transpose(1, 2).reshape(B, Lq,
Hq * D)`` in wmtp/block.py is then a view, where a head-major output made it a copy kernel a layer
for ``Lq >= 2`` (4 of a verify pass's 51 kernels: metrics/experiments/kernel-census-h200-exp27-2396f73.json).
Both kernels store through the output's strides; at ``Lq = 1`` the two layouts are the same memory.
``TOKEN_MAJOR = False`` gives the head-major layout of the code before (experiment 41 times both;
the flag is in the static key, so no plan or compiled launch of the other layout is reused).

NOTE [tf32x3]: float32 dots as IEEE FMA loops keep the small preset's full-attention calls far from
the bandwidth floor (48 us a call where 16K keys' bytes take 7 us on the H200). ``"tf32x3"`` splits
each float32 operand into a TF32 part and a TF32 remainder and adds three tensor-core products,
dropping only the remainders' product: on the H200 it took 58.2-70.8 % less time a full-set call
and 14.6-18.4 % less over short ranges, and met NOTE [Tolerances]' kernel rule (tests/attention_truth.py)
where plain TF32 did not (metrics/experiments/tf32x3-h200-exp31.json). Its operands take more shared memory (a D256
tile of 64 rows compiled to 256 KiB, over the H200's limit; scripts/kernel_sm90.py compiles the
launches offline), so ``precision`` takes it only for tiles of at most 64 rows at ``D <= 64``, on a
GPU: every float32 tile at that width, as ``max_tile_rows`` (attention/plan.py) caps them at 64 rows;
the bound keeps a raise of that cap from reaching tf32x3 unmeasured. The CPU interpreter keeps
``"ieee"``. In the CUDA-graph decode loop (16-row tiles) it took
4.9-53.6 % off dense decoding's time a token and 2.8-55.3 % off speculative decoding's, every run
lossless (metrics/experiments/tf32x3-loop-h200-exp32.json). A prefill's 64-row tiles (NOTE [Chunks]
in attention/triton_attention.py) take it since session 25: the small preset's prefill of 16384
tokens took 57.0-61.0 % less time than with IEEE dots, first tokens equal
(metrics/experiments/prefill-tiles-h200-exp46.json), and the GPU suite passes with it (run DD in
metrics/gpu-tests-h200.txt; an earlier run, DB, stopped at its 290 s limit, most likely compiling
from a cold cache: the suite without it took 317 s on a fresh machine, run DC). The 32-row tiles
between them (17-32 query rows a KV head: a prefill's or a GQA model's verify, as the tiny preset's
two heads a group at depth 8 and more) were not timed apart; the GPU suite covers them. Offline for
sm_90 the 64-row tile spills 200 B with tf32x3 and 5.8 KB with IEEE dots (scripts/kernel_sm90.py).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import torch
import triton.language as tl

from .plan import MAX_POSITIONS, SMEM_H200, launch_config, query_chunk
from .triton_merge import MergeCall, _merge_plan

__all__ = ["FULL", "KernelCall", "plan_call"]

FULL = MAX_POSITIONS  # window=None: a window longer than any position of a cache the kernel takes

TOKEN_MAJOR = True  # NOTE [Output layout]: the output in (B, Lq, Hq, D) memory


@functools.lru_cache(maxsize=None)
def _gpu_limits(device: torch.device) -> tuple[int, int, bool]:
    """(SM count, opt-in shared memory per block, programmatic dependent launch available: NVIDIA
    sm_90+, not ROCm); 99 KiB of shared memory where torch does not report it."""
    props = torch.cuda.get_device_properties(device)
    return (props.multi_processor_count, getattr(props, "shared_memory_per_block_optin", None) or 99 * 1024,
            props.major >= 9 and torch.version.hip is None)


class KernelCall(NamedTuple):
    """One launch of ``_attention_kernel`` as ``_launch`` makes it, and the merge that follows."""

    grid: tuple[int, int]
    args: tuple  # positional arguments: the 8 tensors (q, qs, k, v, bt, q_pos, out, ws), then Python ints
    kwargs: Mapping  # constexprs and the launch options num_warps, num_stages (read-only: cached)
    out: torch.Tensor  # (B, Hq, Lq, D)
    merge: MergeCall | None  # the merge launch, or None with one split (the kernel writes out)
    static: tuple  # what fixes grid, kwargs and every int of args: _static_plan's key (NOTE [Launch cache])


class _Plan(NamedTuple):
    grid: tuple[int, int]
    ints: tuple  # the kernel's int arguments, after its 8 tensors
    kwargs: Mapping
    ws_numel: int  # split workspace elements: m, l (n each) and acc (n * D); 0 without splits
    merge: tuple | None  # the merge's grid, ints, kwargs and static key (with splits)


@functools.lru_cache(maxsize=1024)
def _static_plan(q_shape, q_stride, k_shape, k_stride, bt_stride, page_size, paged, capacity, dtype, device_type,
                 n_sink, window, tuning, limits, q_sink=False, token_major=True, pos_stride=0) -> _Plan:
    """Everything of a call that shapes, strides and Python ints fix, computed once per distinct key."""
    if capacity > MAX_POSITIONS:  # the public ops' triton_refuses says so first; this guards direct calls
        raise ValueError(f"the Triton kernel reads caches of at most 2**30 key positions, got {capacity}; "
                         "use impl='torch'")
    B, Hq, Lq, D = q_shape
    Hkv = k_shape[2]  # k is (outer, position, Hkv, D) in both layouts
    fp64 = dtype == torch.float64
    sms, smem, has_pdl = limits or (None, SMEM_H200, False)
    *tuning, pdl = tuning
    q_sink = bool(q_sink and n_sink and window is not None)  # NOTE [Re-indexed sinks]: a sink range to score
    Lc = query_chunk(Lq, Hq // Hkv, dtype, D)  # NOTE [Chunks]: a tile's queries; n_chunks tiles a (b, kv head)
    n_chunks = -(-Lq // Lc)
    BLOCK_M, BLOCK_N, num_splits, num_warps, num_stages = launch_config(  # every chunk's tile a batch row's
        B * n_chunks, Hq, Hkv, Lc, D, dtype, capacity, n_sink, window, sms, *tuning, smem_bytes=smem,
        q_tiles=2 if q_sink else 1)
    n_sink = 0 if window is None else min(n_sink or 0, capacity)  # sinks past the cache: the same key set
    window = FULL if window is None else min(window, FULL)  # the same key set for positions < FULL
    split = num_splits > 1
    if pdl and not has_pdl:
        raise ValueError("pdl=True needs a CUDA GPU of compute capability 9.0 or newer")
    pdl = split and (has_pdl if pdl is None else pdl)  # NOTE [PDL]
    out_stride = (Lq * Hq * D, D, Hq * D, 1) if token_major else (Hq * Lq * D, Lq * D, D, 1)  # NOTE [Output layout]
    n_rows = n_chunks * B * Hkv * num_splits * BLOCK_M  # partial rows: m and l have n_rows each, acc n_rows * D
    ints = (*q_stride, *k_stride, bt_stride, pos_stride, *out_stride, Hkv, Lc, capacity, n_sink, window, num_splits,
            n_rows, Lq)
    kwargs = dict(GROUP=Hq // Hkv, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_DIM=D, PAGE_SIZE=page_size,
                  PAGED=0 if not paged else 2 if num_stages > 1 else 1, SPLIT=split,  # NOTE [Pages]
                  UPCAST=device_type == "cpu" and dtype == torch.bfloat16,
                  PRECISION=precision(dtype, device_type, BLOCK_M, D),  # NOTE [tf32x3]
                  ACC=tl.float64 if fp64 else tl.float32, PDL=pdl, QSINK=q_sink, CHUNKED=n_chunks > 1,
                  # NOTE [Offsets]: the key loop's offset widths: a page's in the pool, a row's and dim's in a page
                  OFF=tl.int32 if paged and max_offset(k_shape, k_stride) < 2**31 else tl.int64,
                  PAGE_STRIDE=k_stride[0] if paged and max_offset(k_shape, k_stride) >= 2**31 else 0,
                  ROW=tl.int64 if paged and max_offset(k_shape[1::2], k_stride[1::2]) >= 2**31 else tl.int32,
                  num_warps=num_warps, num_stages=num_stages)
    merge = None
    if split:  # the merge's launch, planned here once with the attention's (NOTE [Workspace])
        merge_static = (q_shape, out_stride, Hkv, BLOCK_M, num_splits, pdl, 256, Lc, ws_dtype(dtype), dtype)
        merge = (*_merge_plan(*merge_static[:8]), merge_static)
    ws_numel = n_rows * (D + 2) if split else 0
    return _Plan((n_chunks * B * Hkv, num_splits), ints, MappingProxyType(kwargs), ws_numel, merge)


def precision(dtype: torch.dtype, device_type: str, block_m: int, D: int) -> str:
    """The dots' ``input_precision``: ``"tf32x3"`` for float32 tiles of at most 64 rows at ``D <= 64``
    off the CPU (NOTE [tf32x3]), ``"ieee"`` for other float32 and for float64, ``"tf32"`` for fp16
    and bf16 (where it is unused: the operands are not float32)."""
    if dtype == torch.float32 and device_type != "cpu" and block_m <= 64 and D <= 64:
        return "tf32x3"
    return "ieee" if dtype in (torch.float32, torch.float64) else "tf32"


def max_offset(shape, stride) -> int:
    """The largest element offset into a tensor of this shape and these strides (-1 if it is empty)."""
    return sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else -1


def ws_dtype(dtype: torch.dtype) -> torch.dtype:
    """The partials' dtype: the accumulator's (float64 for float64 inputs, else float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def plan_call(q, k, v, block_table, page_size, q_pos, n_sink, window, tuning, limits, q_sink=None) -> KernelCall:
    """The kernel call for one block of queries, from shapes and Python ints only (NOTE [Host sync]);
    allocates the output and the split workspace on q's device (a ``meta`` device allocates nothing).

    k, v: the caches as the public ops take them, ``(B, Hkv, S, D)`` without a block table and
    ``(num_pages, page_size, Hkv, D)`` with one; the plan reads both as (outer, position, head,
    dim), permuting the contiguous layout's shape and strides (not the tensor: a view costs host
    time). ``tuning`` holds the optional overrides
    ``num_splits, block_n, num_warps, num_stages, pdl``; ``limits`` is ``_gpu_limits`` of the GPU to
    plan for, or None for the CPU interpreter. tests/test_kernel_sm90.py plans H200 calls on ``meta``
    tensors and compiles them offline. ``q_sink``: the queries that score the sinks, with q's strides
    (NOTE [Re-indexed sinks] in attention/triton_attention.py), or None. ``q_pos``: ``(Lq,)``, or
    ``(B, Lq)`` with a contiguous last dimension (each batch row's own positions).
    """
    if block_table is None:  # (B, Hkv, S, D) read as (B, S, Hkv, D): strides (batch, position, head, dim)
        bt, (B, H, S, D), (sb, sh, ss, sd) = q_pos, k.shape, k.stride()
        k_shape, k_stride, capacity = (B, S, H, D), (sb, ss, sh, sd), S
    else:
        bt, k_shape, k_stride = block_table, tuple(k.shape), k.stride()
        capacity = block_table.shape[1] * page_size  # key positions
    pos_stride = q_pos.stride(0) if q_pos.dim() == 2 else 0  # a batch row's positions apart (0: shared)
    static = (tuple(q.shape), q.stride(), k_shape, k_stride, bt.stride(0), page_size, block_table is not None,
              capacity, q.dtype, q.device.type, n_sink, window, tuning, limits, q_sink is not None, TOKEN_MAJOR,
              pos_stride)
    plan = _static_plan(*static)
    B, Hq, Lq, D = q.shape
    out = q.new_empty((B, Lq, Hq, D)).transpose(1, 2) if TOKEN_MAJOR else q.new_empty(q.shape)  # (B, Hq, Lq, D)
    merge = None
    if plan.ws_numel:  # NOTE [Workspace]: one allocation, m | l | acc
        ws = q.new_empty(plan.ws_numel, dtype=ws_dtype(q.dtype))
        grid, ints, kwargs, merge_static = plan.merge
        merge = MergeCall(grid, (ws, out, *ints), kwargs, merge_static)
    else:  # the kernel writes `out` itself; the workspace pointer is unused
        ws = out
    assert not (out.data_ptr() | ws.data_ptr()) & 15, "NOTE [Workspace]: the allocator's blocks must be 16-byte aligned"
    args = (q, q if q_sink is None else q_sink, k, v, bt, q_pos, out, ws, *plan.ints)
    return KernelCall(plan.grid, args, plan.kwargs, out, merge, static)
