"""RoPE as one kernel: the reference in PyTorch and the same op in Triton, one signature.

Every local layer of the target and the MTP head's block rotate their queries and keys by the
angles of the tokens' absolute positions (rotary embedding; arXiv 2607.21535, Sec. 2: the head is
one transformer block, and Sec. 5: the local layers). The reference is about eleven elementwise
kernels a call on a GPU (the angles, their cosine and sine, four products, two sums, a
concatenation); before the frequencies were kept per module (``Attention.frequencies``) it was
about fifteen, and a one-row draft call of the small preset rotated twice, about 30 of its 81
kernels (metrics/experiments/decode-profile-h200-exp17.json). Inside a CUDA graph each kernel costs a few
microseconds however little it computes, so ``impl="triton"`` rotates a block of rows in one program.

Both take ``inv_freq`` ``(D/2,)``, the frequencies ``rope_frequencies`` computes with torch, so the
kernel's angles are the reference's to the bit: an angle is ``position * inv_freq``, a number of up
to a million radians at a million tokens, where one ulp of a float32 frequency moves it by a tenth of
a radian. The kernel then computes ``x1 cos - x2 sin`` and ``x1 sin + x2 cos`` in at least float32,
as the reference does, with its own cosine and sine and possibly fused multiply-adds: the two agree
to rounding, not bit for bit (tests/test_rope.py bounds the difference by the dtype's). Decoding
needs no more: a dense step and a verify pass rotate with the same op, row by row (decode.py NOTE
[Exactness]). The model rotates with the kernel on CUDA unless asked for ``impl="torch"`` or a
gradient is needed (``op_impl`` in wmtp/block.py; ``"auto"`` falls back to the reference under
autograd, as attention does).

``rope_pair`` rotates a layer's queries and keys with one call when they are neighbouring heads of
one tensor, as the stacked q/k/v product leaves them (wmtp/stacked.py): one kernel where there were
two. The rotation is per element, so each output is what ``rope`` gives it alone, bit for bit.

Positions may be per row, ``(B, L)`` where they are otherwise ``(L,)``: batched speculative decoding
with each sequence of the batch at its own position; row ``b`` is rotated as it would be alone at
``pos[b]``.
"""

from __future__ import annotations

import functools

import torch

from .attention import IMPLS, resolve_impl

__all__ = ["check_rope_args", "rope", "rope_frequencies", "rope_pair", "rope_torch", "rope_triton"]

BLOCK_L = 16  # rows (positions) a program rotates


def rope_frequencies(head_dim: int, theta: float, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """RoPE's ``theta ** (-2i / head_dim)`` for ``i < head_dim / 2``, ``(head_dim/2,)``, computed on
    ``device`` in ``dtype`` (at least float32: the accumulation dtype of ``rope``)."""
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: head_dim {head_dim} must be even and positive")
    return theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=dtype) / head_dim)  # (D/2,)


def rope_torch(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """The reference: ``x`` ``(B, H, L, D)`` rotated by the angles ``pos[..., l] * inv_freq`` of
    positions ``pos`` ``(L,)`` or ``(B, L)`` (row ``b`` at ``pos[b]``); halves ``x[..., :D/2]`` and
    ``x[..., D/2:]`` pair up (the Llama layout)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    angles = pos.to(acc)[..., None] * inv_freq  # (L, D/2) or (B, L, D/2)
    if pos.dim() == 2:
        angles = angles[:, None]  # (B, 1, L, D/2): a row's angles for each of its heads
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x.to(acc).chunk(2, dim=-1)  # (B, H, L, D/2) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


@functools.cache
def _kernel():
    """The Triton kernel, defined on first use (importing wmtp never imports triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_kernel(X, Pos, F, Out,  # x (B, H, L, D); pos (L,) or (B, L); inv_freq (D/2,); out contiguous
                     sb, sh, sl, sp, H, L, n_lblk,  # x's strides (its last is 1); pos's batch stride (0: (L,))
                     HALF: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)  # int64 offsets: B * H * L * D may pass 2**31
        bh = pid // n_lblk
        b, h = bh // H, bh % H
        rows = (pid % n_lblk) * BLOCK_L + tl.arange(0, BLOCK_L)  # (BLOCK_L,)
        cols = tl.arange(0, BLOCK_D)  # (BLOCK_D,), BLOCK_D >= HALF
        mask = (rows < L)[:, None] & (cols < HALF)[None, :]  # (BLOCK_L, BLOCK_D)
        p = tl.load(Pos + b * sp + rows, mask=rows < L, other=0).to(ACC)  # (BLOCK_L,): row b's positions
        angle = p[:, None] * tl.load(F + cols, mask=cols < HALF, other=0.0)[None, :]  # the reference's product
        cos, sin = tl.cos(angle), tl.sin(angle)
        src = X + b * sb + h * sh + rows.to(tl.int64)[:, None] * sl + cols[None, :]
        x1 = tl.load(src, mask=mask, other=0.0)
        x2 = tl.load(src + HALF, mask=mask, other=0.0)
        a1, a2 = x1.to(ACC), x2.to(ACC)
        dst = Out + (bh * L + rows.to(tl.int64))[:, None] * (2 * HALF) + cols[None, :]
        tl.store(dst, (a1 * cos - a2 * sin).to(x1.dtype), mask=mask)
        tl.store(dst + HALF, (a1 * sin + a2 * cos).to(x1.dtype), mask=mask)

    return _rope_kernel


def rope_triton(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``rope_torch`` with a program per ``BLOCK_L`` rows of a head (CUDA, or the CPU interpreter).
    Unchecked (a short ``pos`` reads out of bounds): ``rope`` checks first; ``pos`` ``(L,)`` or ``(B, L)``,
    contiguous in its last dimension. Returns a contiguous ``(B, H, L, D)``, as the reference does."""
    import triton
    import triton.language as tl

    if x.is_cuda and x.device.index != torch.cuda.current_device():
        with torch.cuda.device(x.device):  # Triton launches on the current device (and its stream)
            return rope_triton(x, pos, inv_freq)
    if x.stride(-1) != 1:
        x = x.contiguous()
    B, H, L, D = x.shape
    out = torch.empty((B, H, L, D), dtype=x.dtype, device=x.device)  # (B, H, L, D)
    if out.numel():
        n_lblk = triton.cdiv(L, BLOCK_L)
        grid = (n_lblk * B * H,)  # one axis: CUDA caps a grid's second at 65535
        sp = pos.stride(0) if pos.dim() == 2 else 0  # one row of positions for every batch row: stride 0
        _kernel()[grid](x, pos, inv_freq, out, x.stride(0), x.stride(1), x.stride(2), sp, H, L, n_lblk,
                        HALF=D // 2, BLOCK_L=BLOCK_L, BLOCK_D=triton.next_power_of_2(D // 2),
                        ACC=tl.float64 if inv_freq.dtype == torch.float64 else tl.float32)
    return out


def rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """Rotate ``x`` by the RoPE angles of positions ``pos``.

    Args:
        x: ``(B, H, L, D)``, ``D`` even, any layout.
        pos: ``(L,)`` or ``(B, L)`` (row ``b`` at ``pos[b]``) int32 or int64 positions on ``x``'s device.
        inv_freq: ``(D/2,)`` frequencies from ``rope_frequencies``, in ``x``'s dtype promoted to at
            least float32, on ``x``'s device.
        impl: ``"torch"`` (the reference), ``"triton"`` (one kernel; CUDA, or CPU tensors under
            ``TRITON_INTERPRET=1``; it has no backward), or ``"auto"``: the kernel for CUDA tensors
            when triton imports and neither ``x`` nor ``inv_freq`` needs a gradient, else the reference.

    Returns:
        ``(B, H, L, D)`` in ``x``'s dtype.

    Raises:
        ValueError: for another ``impl``; for ``x`` not floating or of another shape, positions or
            frequencies of another shape, dtype or device (both impls: no device value is read); and
            for ``"triton"``, a tensor that needs a gradient or a device where the kernel cannot run.
    """
    if impl not in IMPLS:
        raise ValueError(f"rope takes impl 'auto', 'torch' or 'triton', got {impl!r}")
    check_rope_args(x, pos, inv_freq)
    grad = torch.is_grad_enabled() and (x.requires_grad or inv_freq.requires_grad)
    impl = resolve_impl("torch" if impl == "auto" and grad else impl, x.device)  # where the kernel can run
    if impl == "torch":
        return rope_torch(x, pos, inv_freq)
    if grad:
        raise ValueError("impl='triton' has no backward: x or inv_freq needs a gradient (use impl='torch', or no_grad)")
    return rope_triton(x, pos.contiguous(), inv_freq)


def rope_pair(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor,
              impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """``(rope(q, ...), rope(k, ...))``, as one ``rope`` call over both when ``k``'s heads follow
    ``q``'s in one tensor with the same strides (the stacked projection's views: ``_joined``) and
    neither needs a gradient (the joined view's backward would reach only ``q``), else as two.

    Args:
        q, k: ``(B, Hq, L, D)`` and ``(B, Hkv, L, D)`` of one dtype and device.
        pos, inv_freq, impl: as ``rope``'s.

    Returns:
        The rotated ``q`` and ``k``, bit for bit ``rope``'s on each (views of one tensor when joined).

    Raises:
        ValueError: as ``rope``.
    """
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    qk = None if grad else _joined(q, k)
    if qk is None:
        return rope(q, pos, inv_freq, impl), rope(k, pos, inv_freq, impl)
    out = rope(qk, pos, inv_freq, impl)  # (B, Hq + Hkv, L, D)
    return out[:, : q.shape[1]], out[:, q.shape[1]:]


def _joined(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """``(B, Hq + Hkv, L, D)``: ``q``'s heads then ``k``'s as one view, when ``k`` starts where a next head
    of ``q`` would and both have one stride per dimension (and shape apart from heads), else ``None``."""
    if (q.dim() != 4 or k.dim() != 4 or q.stride() != k.stride() or (q.dtype, q.device) != (k.dtype, k.device)
            or q.shape[:1] + q.shape[2:] != k.shape[:1] + k.shape[2:]
            or q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
            or k.storage_offset() != q.storage_offset() + q.shape[1] * q.stride(1)):
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], *q.shape[2:]), q.stride())


def check_rope_args(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, op: str = "rope",
                    name: str = "x") -> None:
    """``rope``'s checks, from shapes, strides, dtypes and devices only (no host sync on a GPU);
    ``op`` and ``name`` (the rotated argument's) name them in the errors (``qkv_write``'s: wmtp/qkv_write.py)."""
    if x.dim() != 4 or x.shape[-1] % 2 or not x.is_floating_point():
        raise ValueError(f"{op} takes a floating {name} of shape (B, H, L, D) with D even to rotate, got "
                         f"{tuple(x.shape)} {x.dtype}")
    acc = torch.promote_types(x.dtype, torch.float32)
    if inv_freq.shape != (x.shape[-1] // 2,) or inv_freq.stride(0) != 1 or (inv_freq.dtype, inv_freq.device) != (
            acc, x.device):
        raise ValueError(f"{op}'s inv_freq must be ({x.shape[-1] // 2},), contiguous, {acc} on {x.device}; got "
                         f"{tuple(inv_freq.shape)} of stride {inv_freq.stride()}, {inv_freq.dtype} on "
                         f"{inv_freq.device}")
    B, L = x.shape[0], x.shape[2]
    if pos.shape not in ((L,), (B, L)) or pos.dtype not in (torch.int32, torch.int64) or pos.device != x.device:
        raise ValueError(f"{op}'s pos must be ({L},) or ({B}, {L}) int32 or int64 on {x.device}; got "
                         f"{tuple(pos.shape)} {pos.dtype} on {pos.device}")
