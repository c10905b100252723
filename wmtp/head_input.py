"""The MTP head's input row as one kernel: the next token's embedding, the two RMSNorms, side by side.

The head reads ``[norm(h_t), norm(e_{t+1})]``, the target's hidden state and the next token's
embedding, each normalised, before its projection and its one transformer block (arXiv 2607.21535,
Sec. 2; wmtp/mtp.py). The reference is an embedding lookup, two norms and a concatenation: four
kernels a head call on a GPU, and a depth-7 draft calls the head seven times a step. Inside a CUDA
graph each costs a few microseconds however little it computes (docs/results/step-anatomy.md), so
``impl="triton"`` does it in one launch: a program per row and half, the embedding row gathered in
place. Each half is ``rms_norm_triton``'s arithmetic (wmtp/rmsnorm.py), so the row is that of the
unfused kernels bit for bit (tests/test_head_input.py); ``impl="torch"`` is the reference's code.

Token ids are not checked on the device (that would need a host sync): a row whose id is outside
``[0, V)`` comes out NaN where the reference raises (a ValueError on the CPU, a device-side assert on
CUDA). A draft from it
is rejected by the target's verification, so decoding stays lossless.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from .attention import IMPLS, resolve_impl
from .rmsnorm import eps_halves, rms_norm_torch, rows_of

__all__ = ["head_input", "head_input_torch", "head_input_triton"]


def head_input_torch(hidden: torch.Tensor, ids: torch.Tensor, embed: torch.Tensor, w_hidden: torch.Tensor,
                     w_embed: torch.Tensor, eps_hidden: float, eps_embed: float) -> torch.Tensor:
    """The reference: ``cat([rms_norm(hidden), rms_norm(embed[ids])], -1)``, ``(..., 2N)``."""
    e = F.embedding(ids, embed)  # (..., N)
    return torch.cat([rms_norm_torch(hidden, w_hidden, eps_hidden), rms_norm_torch(e, w_embed, eps_embed)], dim=-1)


@functools.cache
def _kernel():
    """The Triton kernel, defined on first use (importing wmtp never imports triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _head_input_kernel(H, Ids, E, Wh, We, Out,  # hidden rows (R, N); ids (R,); embed (V, N); out (R, 2N)
                           stride_h, N, V, eh_hi, eh_lo, ee_hi, ee_lo,  # each eps as two float32 halves (NOTE [eps])
                           BLOCK: tl.constexpr, ACC: tl.constexpr):  # BLOCK >= N, a power of two
        row = tl.program_id(0).to(tl.int64)  # int64 offsets: R * N may pass 2**31
        half = tl.program_id(1)  # 0: the hidden state, 1: the embedding
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        if half == 0:
            acc = tl.load(H + row * stride_h + cols, mask=mask, other=0.0).to(ACC)  # (BLOCK,)
            w = tl.load(Wh + cols, mask=mask, other=0.0)
            eps_hi, eps_lo = eh_hi, eh_lo
        else:
            tok = tl.load(Ids + row).to(tl.int64)
            ok = (tok >= 0) & (tok < V)
            x = tl.load(E + tl.where(ok, tok, 0) * N + cols, mask=mask & ok, other=0.0)  # (BLOCK,), the gathered row
            acc = tl.where(ok, x.to(ACC), float("nan"))  # an id out of range: a NaN row, never a stray read
            w = tl.load(We + cols, mask=mask, other=0.0)
            eps_hi, eps_lo = ee_hi, ee_lo
        mean = tl.sum(acc * acc, axis=0) / N  # from here rms_norm_triton's steps
        scale = 1.0 / tl.sqrt(mean + eps_hi + eps_lo)
        tl.store(Out + row * (2 * N) + half * N + cols, (acc * scale).to(Out.dtype.element_ty) * w, mask=mask)

    return _head_input_kernel


def head_input_triton(hidden: torch.Tensor, ids: torch.Tensor, embed: torch.Tensor, w_hidden: torch.Tensor,
                      w_embed: torch.Tensor, eps_hidden: float, eps_embed: float) -> torch.Tensor:
    """``head_input_torch`` in one launch (CUDA, or the CPU interpreter). Unchecked: ``head_input``
    checks first. Returns a contiguous ``(..., 2N)``."""
    import triton
    import triton.language as tl

    N = hidden.shape[-1]
    rows = rows_of(hidden)  # (R, N)
    embed = embed if embed.is_contiguous() else embed.contiguous()
    out = torch.empty((*hidden.shape[:-1], 2 * N), dtype=hidden.dtype, device=hidden.device)  # (..., 2N)
    if rows.shape[0]:
        with torch.cuda.device(hidden.device) if hidden.is_cuda else contextlib.nullcontext():  # Triton's device
            _kernel()[(rows.shape[0], 2)](rows, ids.reshape(-1).contiguous(), embed, w_hidden, w_embed, out,
                                          rows.stride(0), N, embed.shape[0], *eps_halves(eps_hidden),
                                          *eps_halves(eps_embed), BLOCK=triton.next_power_of_2(N),
                                          ACC=tl.float64 if hidden.dtype == torch.float64 else tl.float32)
    return out


def head_input(hidden: torch.Tensor, ids: torch.Tensor, embed: torch.Tensor, w_hidden: torch.Tensor,
               w_embed: torch.Tensor, eps_hidden: float, eps_embed: float, impl: str = "auto") -> torch.Tensor:
    """The MTP head's input: ``hidden`` and the embedding of ``ids``, each RMS-normalised, side by side.

    Args:
        hidden: ``(..., N)`` floating, any layout.
        ids: ``(...)`` integer token ids in ``[0, V)`` (unchecked on the kernel's route: see above).
        embed: ``(V, N)`` embedding table of ``hidden``'s dtype and device.
        w_hidden, w_embed: ``(N,)`` norm weights, contiguous, of ``hidden``'s dtype and device.
        eps_hidden, eps_embed: each norm's ``eps``.
        impl: ``"torch"`` (the reference), ``"triton"`` (one launch; CUDA, or CPU tensors under
            ``TRITON_INTERPRET=1``; no backward), or ``"auto"``: the kernel for CUDA tensors when
            triton imports and no tensor needs a gradient, else the reference.

    Returns:
        ``(..., 2N)`` in ``hidden``'s dtype.

    Raises:
        ValueError: for another ``impl``, mismatched shapes, dtypes or devices, non-integer ids, ids
            outside ``[0, V)`` on the reference's CPU route, and
            for ``"triton"`` a tensor that needs a gradient or a device where the kernel cannot run.
    """
    if impl not in IMPLS:
        raise ValueError(f"head_input takes impl 'auto', 'torch' or 'triton', got {impl!r}")
    N = hidden.shape[-1] if hidden.dim() else 0
    if not hidden.is_floating_point() or not N or embed.dim() != 2 or embed.shape[1] != N or not embed.shape[0]:
        raise ValueError(f"head_input takes floating hidden (..., N) with N >= 1 and embed (V, N) with V >= 1; got "
                         f"{tuple(hidden.shape)} {hidden.dtype} and {tuple(embed.shape)}")
    if ids.shape != hidden.shape[:-1] or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"head_input's ids must be int32 or int64 of shape {tuple(hidden.shape[:-1])}; got "
                         f"{tuple(ids.shape)} {ids.dtype}")
    for name, t in (("embed", embed), ("w_hidden", w_hidden), ("w_embed", w_embed), ("ids", ids)):
        if t.device != hidden.device or (name != "ids" and t.dtype != hidden.dtype):
            raise ValueError(f"head_input's {name} must be on {hidden.device}" + ("" if name == "ids" else
                             f" in {hidden.dtype}") + f"; got {t.dtype} on {t.device}")
    for name, w in (("w_hidden", w_hidden), ("w_embed", w_embed)):
        if w.shape != (N,) or w.stride(0) != 1:
            raise ValueError(f"head_input's {name} must be ({N},) and contiguous; got {tuple(w.shape)} of "
                             f"stride {w.stride()}")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (hidden, embed, w_hidden, w_embed))
    impl = resolve_impl("torch" if impl == "auto" and grad else impl, hidden.device)  # where the kernel can run
    if impl == "torch":
        try:
            return head_input_torch(hidden, ids, embed, w_hidden, w_embed, eps_hidden, eps_embed)
        except IndexError:  # the CPU's range check (no sync added; on CUDA a device-side assert)
            raise ValueError(f"head_input's ids must lie in [0, {embed.shape[0]})") from None
    if grad:
        raise ValueError("impl='triton' has no backward: a tensor needs a gradient (use impl='torch', or no_grad)")
    return head_input_triton(hidden, ids, embed, w_hidden, w_embed, eps_hidden, eps_embed)
