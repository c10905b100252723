"""The windowed draft's read floor: a Triton kernel that reads its keys and values and does nothing
else (arXiv 2607.21535, Sec. 4: the draft-KV tax is memory traffic).

``wmtp bench attention`` sets the windowed draft's device time beside what merely reading the same
bytes costs under the same timing: the union of the key sets of queries at ``q_pos`` (the sinks
``[0, sink_hi)`` and the recent range ``[rec_lo, t_max]``, wmtp/keyset.py) of every kv head, K and
V, from a contiguous ``(B, Hkv, S, D)`` cache (every row at the same positions). Like the draft
kernel, each program first loads the positions (a device tensor: no host sync) and plans its ranges
on device with the kernel's own ``_key_plan`` (attention/triton_attention.py); then it loads one
block of ``BLOCK_N`` keys and values, and writes their sum, one number, so that the loads cannot be
dropped. No dot products, no softmax, no merge.

``READ_CONFIGS`` are the block sizes and warps tried; the bench reports the fastest. It is the
floor of this kernel shape, measured, not a bound on every possible kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .attention.triton_attention import _key_plan

__all__ = ["READ_CONFIGS", "read_key_set", "read_floor_ms"]

READ_CONFIGS = ((64, 4), (32, 8), (16, 4))  # (BLOCK_N, num_warps); on an H200 the last two ran fastest


@triton.jit
def _read_kernel(K, V, QPOS, Out,  # K, V: (B, Hkv, S, D) contiguous in D; QPOS: (Lq,) consecutive; Out: (B, Hkv, n_blk)
                 stride_kb, stride_kh, stride_kpos, S, Lq, n_sink, window, n_blk_sink,
                 BLOCK_N: tl.constexpr, D: tl.constexpr):
    h = tl.program_id(0)
    blk = tl.program_id(1)
    b = tl.program_id(2)
    t_min = tl.minimum(tl.load(QPOS), S - 1)  # clamped, as the attention kernel clamps: no read past S
    t_max = tl.minimum(tl.load(QPOS + Lq - 1), S - 1)
    sink_hi, _, _, rec_lo, rec_hi, _, _, _ = _key_plan(t_min, t_max, n_sink, window, BLOCK_N)  # the kernel's plan
    in_sink = blk < n_blk_sink
    lo = tl.where(in_sink, 0, rec_lo)
    hi = tl.where(in_sink, sink_hi, rec_hi)
    kpos = lo + tl.where(in_sink, blk, blk - n_blk_sink) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    read = kpos < hi
    off = (b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh  # int64: NOTE [Offsets] of the kernel
           + kpos.to(tl.int64)[:, None] * stride_kpos + tl.arange(0, D)[None, :])  # (BLOCK_N, D)
    k = tl.load(K + off, mask=read[:, None], other=0.0)
    v = tl.load(V + off, mask=read[:, None], other=0.0)
    tl.store(Out + (b * tl.num_programs(0) + h) * tl.num_programs(1) + blk, tl.sum(k.to(tl.float32) + v.to(tl.float32)))


def read_key_set(k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, n_sink: int, window: int,
                 block_n: int = 64, num_warps: int = 4) -> torch.Tensor:
    """Read K and V of the union of the key sets of consecutive positions ``q_pos`` (``q_pos[i] =
    q_pos[0] + i``, each ``< S``: the bench's queries; not checked, which would need a host sync), in
    every batch row; return one fp32 sum per program ``(B, Hkv, n_blk)`` (their total is the sum of
    those keys' and values' elements). Positions past the cache are clamped to ``S - 1``, as the
    attention kernel does.

    The grid comes from shapes only: ``cdiv(min(n_sink, S), block_n)`` sink blocks and
    ``cdiv(window + Lq - 1, block_n)`` recent blocks per kv head (enough for consecutive positions);
    blocks past a range read nothing.

    Raises:
        ValueError: for a layout other than ``(B, Hkv, S, D)`` contiguous in D, a head dim that is not
            a power of two, a ``block_n`` that is not one, or an empty ``q_pos``.
    """
    if k.dim() != 4 or k.shape != v.shape or k.stride() != v.stride() or k.stride(-1) != 1:
        raise ValueError(f"k and v must be alike, (B, Hkv, S, D) and contiguous in D; got {tuple(k.shape)}")
    D, n = k.shape[-1], q_pos.numel()
    if D & (D - 1) or block_n < 1 or block_n & (block_n - 1) or n < 1:
        raise ValueError(f"need power-of-two head dim and block_n and a position; got {D}, {block_n}, {n}")
    n_blk_sink = triton.cdiv(min(n_sink, k.shape[2]), block_n)
    n_blk = n_blk_sink + triton.cdiv(window + n - 1, block_n)
    B, Hkv, S, _ = k.shape
    out = torch.empty(B, Hkv, n_blk, device=k.device, dtype=torch.float32)  # (B, Hkv, n_blk)
    _read_kernel[(Hkv, n_blk, B)](k, v, q_pos, out, k.stride(0), k.stride(1), k.stride(2), S, n, n_sink, window,
                                  n_blk_sink, BLOCK_N=block_n, D=D, num_warps=num_warps)
    return out


def read_floor_ms(k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, n_sink: int, window: int,
                  timer: Callable) -> float | str:
    """``timer(fn)`` (a timing of wmtp/bench_timing.py: ms, or an error string) of the fastest
    ``READ_CONFIGS`` launch of ``read_key_set`` (CUDA); the first launch's error if every launch fails."""
    times = [timer(lambda b=b, w=w: read_key_set(k, v, q_pos, n_sink, window, b, w)) for b, w in READ_CONFIGS]
    return min((t for t in times if isinstance(t, float)), default=times[0])
