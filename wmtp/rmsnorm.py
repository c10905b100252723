"""RMSNorm as one kernel: the reference in PyTorch and the same op in Triton, one signature.

Every block of the target and of the MTP head normalises its input twice, and the head's input
and the LM head's once more (arXiv 2607.21535, Sec. 2: the head is one transformer block). The
reference is six elementwise and reduction kernels on a GPU (square, mean, add, rsqrt, scale,
weight); a one-row draft call of the small preset launches about 81 kernels, 30 of them for its
five norms (metrics/experiments/decode-profile-h200-exp17.json). Inside a CUDA graph a kernel costs
a few microseconds of device time however little it computes, so ``impl="triton"`` does a row in
one program: load, sum of squares, scale, weight, store.

Both compute ``(x / sqrt(mean(x ** 2) + eps)).to(x.dtype) * weight`` in at least float32 (float64
for float64 inputs); the sums run in another order, so the two agree to rounding, not bit for bit
(tests/test_rmsnorm.py bounds the difference by the dtype's). Decoding needs no more: a dense step
and a verify pass use the same op, row by row (decode.py NOTE [Exactness]). The model norms with the
kernel where attention runs Triton on CUDA (``norm_impl`` in wmtp/model.py). Side by side on the H200
(experiment 25, metrics/experiments/fused-norm-h200-exp25.json, the CUDA-graph loop): dense decoding
takes 6.5-18.4 % less time a token, speculative decoding 7.9-22.1 % less.

NOTE [eps]: Triton passes a Python float to a kernel as float32, and 1e-5 in float32 is off by
2.5e-13, which a float64 norm would carry (50-100 ulps on the H200). The launcher passes ``eps``
as the sum of two float32 numbers, its float32 rounding and the rest, exact to about 1e-20.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["rms_norm", "rms_norm_torch"]


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
    def _rms_norm_kernel(X, W, Out, stride_x, N, eps_hi, eps_lo, BLOCK: tl.constexpr, ACC: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
        acc = x.to(ACC)
        mean = tl.sum(acc * acc, axis=0) / N
        scale = 1.0 / tl.sqrt(mean + eps_hi + eps_lo)  # eps in two float32 halves, each widened exactly: NOTE [eps]
        w = tl.load(W + cols, mask=mask, other=0.0)
        tl.store(Out + row * N + cols, (acc * scale).to(x.dtype) * w, mask=mask)

    return _rms_norm_kernel


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm_torch`` in one Triton program per row (CUDA, or the CPU interpreter)."""
    import triton
    import triton.language as tl

    N = x.shape[-1]
    rows = x.reshape(-1, N)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)  # (rows, N)
    acc = tl.float64 if x.dtype == torch.float64 else tl.float32
    eps_hi = float(torch.tensor(eps, dtype=torch.float32))  # NOTE [eps]: a float argument reaches Triton as float32
    if rows.shape[0]:
        _kernel()[(rows.shape[0],)](rows, weight, out, rows.stride(0), N, eps_hi, eps - eps_hi,
                                    BLOCK=triton.next_power_of_2(N), ACC=acc)
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, impl: str = "torch") -> torch.Tensor:
    """RMSNorm of ``x`` ``(..., N)`` over its last dimension, times ``weight`` ``(N,)`` of ``x``'s dtype.

    Args:
        impl: ``"torch"`` (the reference) or ``"triton"`` (one kernel; CUDA, or CPU tensors under
            ``TRITON_INTERPRET=1``); a resolved name, as the model passes it (``resolve_impl``).

    Raises:
        ValueError: for another ``impl``.
    """
    if impl == "torch":
        return rms_norm_torch(x, weight, eps)
    if impl == "triton":
        return rms_norm_triton(x, weight, eps)
    raise ValueError(f"rms_norm takes impl 'torch' or 'triton' (resolved), got {impl!r}")
