"""RMSNorm as one kernel: the reference in PyTorch and the same op in Triton, one signature.

Every block of the target and of the MTP head normalises its input twice; the head also normalises
its two inputs (the hidden state and the token's embedding) and the LM head's input once each (arXiv
2607.21535, Sec. 2: the head is one transformer block). The
reference is six elementwise and reduction kernels on a GPU (square, mean, add, rsqrt, scale,
weight); a one-row draft call of the small preset launches about 81 kernels, 30 of them for its
five norms (metrics/experiments/decode-profile-h200-exp17.json). Inside a CUDA graph a kernel costs
a few microseconds of device time however little it computes, so ``impl="triton"`` does a row in
one program: load, sum of squares, scale, weight, store.

Both compute ``(x / sqrt(mean(x ** 2) + eps)).to(x.dtype) * weight`` in at least float32 (float64
for float64 inputs); the sums run in another order, so the two agree to rounding, not bit for bit
(tests/test_rmsnorm.py bounds the difference by the dtype's). Decoding needs no more: a dense step
and a verify pass use the same op, row by row (decode.py NOTE [Exactness]). The model norms with the
kernel on CUDA unless asked for ``impl="torch"`` or a gradient is needed (``op_impl`` in
wmtp/block.py; ``"auto"`` falls back to the reference under autograd, as attention does). Side by side on the H200
(experiment 25, metrics/experiments/fused-norm-h200-exp25.json, the CUDA-graph loop): dense decoding
takes 6.5-18.4 % less time a token, speculative decoding 7.9-22.1 % less.

``add_rms_norm`` makes a residual addition and the norm that reads its sum one kernel (NOTE
[Pending addition] in wmtp/block.py): the sum rounded as torch's ``x + r``, then this norm, so both
outputs are the unfused ops' bit for bit, and a block launches no addition of its own. Side by
side on the H200 (experiment 37, metrics/experiments/add-norm-h200-exp37.json): dense decoding takes
3.1-5.9 % less time a token, speculative decoding 1.8-4.6 % less.

NOTE [eps]: Triton passes a Python float to a kernel as float32, and 1e-5 in float32 is off by
2.5e-13, which a float64 norm would carry (50-100 ulps on the H200). The launcher passes ``eps``
as the sum of two float32 numbers, its float32 rounding and the rest, exact to about 1e-20
(``eps_halves``).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import torch

from .attention import IMPLS, resolve_impl

__all__ = ["add_rms_norm", "eps_halves", "rms_norm", "rms_norm_torch", "rms_norm_triton"]


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., N)`` as rows ``(R, N)`` with a unit last stride: a view with evenly strided rows
    when one exists, else a contiguous copy (what the row kernels here and in wmtp/fused.py and
    wmtp/head_input.py read)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference: ``x`` ``(..., N)`` normalised over its last dimension, times ``weight`` ``(N,)``."""
    acc = x.to(torch.promote_types(x.dtype, torch.float32))
    acc = acc * torch.rsqrt(acc.pow(2).mean(-1, keepdim=True) + eps)
    return acc.to(x.dtype) * weight


@functools.cache
def _kernel():
    """The Triton kernel, defined on first use (importing wmtp never imports triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _rms_norm_kernel(X, W, Out,  # rows (R, N) of row stride stride_x; weight (N,); out (R, N) contiguous
                         stride_x, N, eps_hi, eps_lo,  # eps = eps_hi + eps_lo (NOTE [eps])
                         BLOCK: tl.constexpr, ACC: tl.constexpr):  # BLOCK >= N, a power of two; ACC fp32/fp64
        row = tl.program_id(0).to(tl.int64)  # int64 offsets: R * N may pass 2**31
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)  # (BLOCK,), masked lanes 0
        acc = x.to(ACC)
        mean = tl.sum(acc * acc, axis=0) / N
        scale = 1.0 / tl.sqrt(mean + eps_hi + eps_lo)  # eps in two float32 halves, each widened exactly: NOTE [eps]
        w = tl.load(W + cols, mask=mask, other=0.0)
        tl.store(Out + row * N + cols, (acc * scale).to(x.dtype) * w, mask=mask)

    @triton.jit
    def _add_rms_norm_kernel(X, R, W, Sum, Out,  # rows (R, N) of x and r; weight (N,); sum, out (R, N) contiguous
                             stride_x, stride_r, N, eps_hi, eps_lo,  # eps = eps_hi + eps_lo (NOTE [eps])
                             BLOCK: tl.constexpr, ACC: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)  # (BLOCK,)
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
        s = (x.to(ACC) + r.to(ACC)).to(x.dtype)  # torch's x + r: in float32 (float64) and rounded once
        tl.store(Sum + row * N + cols, s, mask=mask)
        acc = s.to(ACC)  # from here _rms_norm_kernel's steps on the sum
        mean = tl.sum(acc * acc, axis=0) / N
        scale = 1.0 / tl.sqrt(mean + eps_hi + eps_lo)
        w = tl.load(W + cols, mask=mask, other=0.0)
        tl.store(Out + row * N + cols, (acc * scale).to(x.dtype) * w, mask=mask)

    return _rms_norm_kernel, _add_rms_norm_kernel


@functools.lru_cache(maxsize=64)
def eps_halves(eps: float) -> tuple[float, float]:
    """``eps`` as ``(hi, lo)``: ``hi`` its float32 rounding, ``lo = eps - hi`` (exact in float64);
    Triton passes each as float32, and ``hi + lo`` widened is ``eps`` to about 1e-20 (NOTE [eps])."""
    hi = float(np.float32(eps))
    return hi, eps - hi


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm_torch`` in one Triton program per row (CUDA, or the CPU interpreter); ``weight`` and
    ``x`` checked by ``rms_norm``."""
    import triton
    import triton.language as tl

    if x.is_cuda and x.device.index != torch.cuda.current_device():
        with torch.cuda.device(x.device):  # Triton launches on the current device (and its stream)
            return rms_norm_triton(x, weight, eps)
    N = x.shape[-1]
    rows = rows_of(x)  # (R, N)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)  # (R, N)
    if rows.shape[0]:
        _kernel()[0][(rows.shape[0],)](rows, weight, out, rows.stride(0), N, *eps_halves(eps),
                                    BLOCK=triton.next_power_of_2(N), ACC=tl.float64 if x.dtype == torch.float64
                                    else tl.float32)
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, impl: str = "auto") -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension, times ``weight``.

    Args:
        x: ``(..., N)``, any layout, ``N >= 1``.
        weight: ``(N,)`` of ``x``'s dtype and device.
        eps: added to the mean square.
        impl: ``"torch"`` (the reference), ``"triton"`` (one kernel; CUDA, or CPU tensors under
            ``TRITON_INTERPRET=1``; it has no backward), or ``"auto"``: the kernel for CUDA tensors
            when triton imports and no tensor needs a gradient, else the reference.

    Returns:
        ``(..., N)`` in ``x``'s dtype.

    Raises:
        ValueError: for another ``impl``, or (``"triton"``) a tensor that needs a gradient, a weight of
            another shape, stride, dtype or device, or a device where the kernel cannot run.
    """
    if not _takes_kernel("rms_norm", impl, x, weight):
        return rms_norm_torch(x, weight, eps)
    return rms_norm_triton(x, weight, eps)


def _takes_kernel(op: str, impl: str, x: torch.Tensor, weight: torch.Tensor, *more: torch.Tensor) -> bool:
    """Whether ``op`` runs its kernel: ``impl`` resolved as ``rms_norm`` documents it (``"auto"``: the
    reference when any of ``x, weight, *more`` needs a gradient), and for the kernel its inputs
    checked. Raises ``ValueError`` for an unknown ``impl`` and what the kernel cannot take."""
    if impl not in IMPLS:
        raise ValueError(f"{op} takes impl 'auto', 'torch' or 'triton', got {impl!r}")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, *more))
    if resolve_impl("torch" if impl == "auto" and grad else impl, x.device) == "torch":  # where the kernel can run
        return False
    if grad:
        raise ValueError("impl='triton' has no backward: a tensor needs a gradient (use impl='torch', or no_grad)")
    if weight.shape != (x.shape[-1],) or weight.stride(0) != 1 or (weight.dtype, weight.device) != (x.dtype, x.device):
        raise ValueError(f"{op}'s weight must be ({x.shape[-1]},), contiguous, {x.dtype} on {x.device}; got "
                         f"{tuple(weight.shape)} of stride {weight.stride()}, {weight.dtype} on {weight.device}")
    if not x.shape[-1]:
        raise ValueError(f"{op} needs N >= 1 entries a row")
    return True


def add_rms_norm(x: torch.Tensor, r: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """A residual addition and the RMSNorm after it: ``(x + r, rms_norm(x + r, weight, eps))``, with
    ``impl="triton"`` in one kernel (the sum rounded as torch's ``x + r``, so both outputs are the
    unfused ops' bit for bit); ``r=None``: ``(x, rms_norm(x, ...))``.

    Args:
        x, r: ``(..., N)`` of one shape, dtype and device, any layout.
        weight, eps, impl: as ``rms_norm``'s.

    Raises:
        ValueError: as ``rms_norm``, and for an ``r`` of another shape, dtype or device.
    """
    if r is None:
        return x, rms_norm(x, weight, eps, impl)
    if (r.shape, r.dtype, r.device) != (x.shape, x.dtype, x.device):
        raise ValueError(f"add_rms_norm's x and r must be of one shape, dtype and device; got {tuple(x.shape)} "
                         f"{x.dtype} on {x.device} and {tuple(r.shape)} {r.dtype} on {r.device}")
    if not _takes_kernel("add_rms_norm", impl, x, weight, r):
        s = x + r
        return s, rms_norm_torch(s, weight, eps)
    import triton
    import triton.language as tl

    xr, rr = rows_of(x), rows_of(r)
    total, out = torch.empty(xr.shape, dtype=x.dtype, device=x.device), torch.empty(xr.shape, dtype=x.dtype,
                                                                                    device=x.device)  # (R, N) each
    if xr.shape[0]:
        with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():  # Triton's current device
            _kernel()[1][(xr.shape[0],)](xr, rr, weight, total, out, xr.stride(0), rr.stride(0), x.shape[-1],
                                         *eps_halves(eps), BLOCK=triton.next_power_of_2(x.shape[-1]),
                                         ACC=tl.float64 if x.dtype == torch.float64 else tl.float32)
    return total.view(x.shape), out.view(x.shape)
