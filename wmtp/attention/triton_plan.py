"""The Triton kernels' launch, planned on the host from shapes and Python ints (arXiv 2607.21535, Sec. 3).

``plan_call`` turns one call of ``attention_triton`` / ``paged_attention_triton``
(attention/triton_attention.py) into ``_attention_kernel``'s grid, arguments and constexprs, and
the merge's arguments. Everything but the tensors follows from shapes, strides, dtype, the key set
and the launch overrides, so ``_static_plan`` computes it once per distinct key (an LRU cache) and
``plan_call`` only allocates the output and the split workspace; the key doubles as the launch
cache's (NOTE [Launch cache] in attention/launch.py). NOTE [Launch] in attention/triton_attention.py
says how the launch is chosen (``launch_config``, attention/plan.py); NOTE [Host sync] why no
device value is read here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import torch
import triton.language as tl

from .plan import SMEM_H200, launch_config

__all__ = ["FULL", "KernelCall", "plan_call"]

FULL = 1 << 30  # window=None: a window longer than any position (int32-safe: t - FULL does not wrap)


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
    args: tuple  # positional arguments: the 9 tensors, then Python ints
    kwargs: Mapping  # constexprs and the launch options num_warps, num_stages (read-only: cached)
    out: torch.Tensor  # (B, Hq, Lq, D)
    merge: tuple | None  # merge_splits' arguments, or None with one split (the kernel writes out)
    static: tuple  # what fixes grid, kwargs and every int of args: _static_plan's key (NOTE [Launch cache])


class _Plan(NamedTuple):
    grid: tuple[int, int]
    ints: tuple  # the kernel's int arguments, after its 9 tensors
    kwargs: Mapping
    ws_numel: int  # split workspace elements: m, l (n each) and acc (n * D); 0 without splits
    block_m: int
    num_splits: int
    pdl: bool


@functools.lru_cache(maxsize=1024)
def _static_plan(q_shape, q_stride, k_shape, k_stride, bt_stride, page_size, paged, capacity, dtype, device_type,
                 n_sink, window, tuning, limits) -> _Plan:
    """Everything of a call that shapes, strides and Python ints fix, computed once per distinct key."""
    B, Hq, Lq, D = q_shape
    Hkv = k_shape[2]  # k is (outer, position, Hkv, D) in both layouts
    fp64 = dtype == torch.float64
    sms, smem, has_pdl = limits or (None, SMEM_H200, False)
    *tuning, pdl = tuning
    BLOCK_M, BLOCK_N, num_splits, num_warps, num_stages = launch_config(
        B, Hq, Hkv, Lq, D, dtype, capacity, n_sink, window, sms, *tuning, smem_bytes=smem)
    n_sink = 0 if window is None else min(n_sink or 0, capacity)  # sinks past the cache: the same key set
    window = FULL if window is None else min(window, FULL)  # the same key set for positions < FULL
    split = num_splits > 1
    if pdl and not has_pdl:
        raise ValueError("pdl=True needs a CUDA GPU of compute capability 9.0 or newer")
    pdl = split and (has_pdl if pdl is None else pdl)  # NOTE [PDL]
    out_stride = (Hq * Lq * D, Lq * D, D, 1)  # (B, Hq, Lq, D) contiguous
    ints = (*q_stride, *k_stride, bt_stride, *out_stride, Hkv, Lq, capacity, n_sink, window, num_splits)
    kwargs = dict(GROUP=Hq // Hkv, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_DIM=D, PAGE_SIZE=page_size,
                  PAGED=0 if not paged else 2 if num_stages > 1 else 1, SPLIT=split,  # NOTE [Pages]
                  UPCAST=device_type == "cpu" and dtype == torch.bfloat16,
                  PRECISION="ieee" if dtype in (torch.float32, torch.float64) else "tf32",
                  ACC=tl.float64 if fp64 else tl.float32, PDL=pdl, num_warps=num_warps, num_stages=num_stages)
    ws_numel = B * Hkv * num_splits * BLOCK_M * (D + 2) if split else 0
    return _Plan((B * Hkv, num_splits), ints, MappingProxyType(kwargs), ws_numel, BLOCK_M, num_splits, pdl)


def plan_call(q, k, v, block_table, page_size, q_pos, n_sink, window, tuning, limits) -> KernelCall:
    """The kernel call for one block of queries, from shapes and Python ints only (NOTE [Host sync]);
    allocates the output and the split workspace on q's device (a ``meta`` device allocates nothing).

    k, v strides are (outer, position, head, dim). ``tuning`` holds the optional overrides
    ``num_splits, block_n, num_warps, num_stages, pdl``; ``limits`` is ``_gpu_limits`` of the GPU to
    plan for, or None for the CPU interpreter. tests/test_kernel_sm90.py plans H200 calls on ``meta``
    tensors and compiles them offline.
    """
    bt = block_table if block_table is not None else q_pos
    capacity = k.shape[1] if block_table is None else block_table.shape[1] * page_size  # key positions
    static = (tuple(q.shape), q.stride(), tuple(k.shape), k.stride(), bt.stride(0), page_size, block_table is not None,
              capacity, q.dtype, q.device.type, n_sink, window, tuning, limits)
    plan = _static_plan(*static)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (B, Hq, Lq, D)
    if plan.ws_numel:  # one workspace: m, l (B*Hkv, n_splits, BLOCK_M) and acc (B*Hkv, n_splits, BLOCK_M, D)
        ws = q.new_empty(plan.ws_numel, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
        n = plan.ws_numel // (q.shape[-1] + 2)
        pm, pl, pacc = ws.split_with_sizes((n, n, plan.ws_numel - 2 * n))  # flat views: one call, not three
    else:  # the kernel writes `out` itself; the partial pointers are unused
        pm = pl = pacc = out
    args = (q, k, v, bt, q_pos, out, pm, pl, pacc, *plan.ints)
    merge = (pm, pl, pacc, out, k.shape[2], plan.block_m, plan.num_splits, plan.pdl) if plan.ws_numel else None
    return KernelCall(plan.grid, args, plan.kwargs, out, merge, static)
