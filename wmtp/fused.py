"""Small chains of a decode step as one kernel each: the global layers' log-length query scaling,
SwiGLU's activation, and a layer's key and value writes into a contiguous KV cache, each with a
PyTorch reference and a Triton kernel of one signature.

The target's full-attention layers (arXiv 2607.21535, Sec. 5: the few layers of a hybrid model that
hold the whole KV) scale their queries by ``max(1, log(t + 1) / log(train_seq_len))`` (``Attention`` in wmtp/block.py).
In PyTorch that is six kernels a layer on a GPU (a cast, an add, a log, a division, a clamp, the
product), and SwiGLU's ``silu(gate) * up`` two a block. Inside a CUDA graph each kernel costs a few
microseconds however little it computes: experiment 27 counted 14 µs of a dense step's 287 µs in the
scaling's twelve kernels, 11 µs in the activations' eight and 16 µs in the caches' eight writes
(two a layer, keys and values: metrics/experiments/kernel-census-h200-exp27.json). ``impl="triton"``
does each chain in one kernel. (The ring and paged caches keep their indexed writes.)

The scaling and the activation compute in at least float32, as the references do: the scale as ``log(t + 1) /
log(T)`` in the accumulation dtype (``T`` passed as an int: Triton would pass a float as float32,
NOTE [eps] in wmtp/rmsnorm.py), rounded to the query's dtype before the product, as the reference
rounds it; ``silu(g) = g / (1 + exp(-g))``. They agree with the references to rounding, not
bit for bit (their logarithm and exponential are Triton's): decoding needs no more, since a dense step
and a verify pass scale with the same op (decode.py NOTE [Exactness]). The model takes the kernels on
CUDA unless asked for ``impl="torch"`` or a gradient is needed (``op_impl`` in wmtp/block.py).
The write copies and casts, so it is the indexed assignment bit for bit, for positions in ``[0, S)``:
the kernel writes no other (the reference would wrap a negative one and raise for one past the
end), and the caller checks the range (``KVCache.update``, unless its caller checked once).
In the CUDA-graph decode loop on the H200, every run lossless, the scaling and activation kernels
took 5.8-10.8 % off dense decoding's time a token and 1.9-5.1 % off speculative decoding's
(metrics/experiments/fused-ops-h200-exp35.json); then the write kernel 3.4-7.1 % and 2.8-6.6 %
(metrics/experiments/kv-write-h200-exp36.json). Since experiment 42 the model writes a contiguous
cache through ``qkv_write`` (wmtp/qkv_write.py), this write with the layer's rotation or scaling in
the same kernel; ``KVCache.update`` still writes with this one.

Positions may be per row, ``(B, L)`` where they are otherwise ``(L,)``: batched speculative decoding
with each sequence of the batch at its own position; row ``b`` is scaled or written as it would be
alone at ``pos[b]``.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.nn.functional as F

from .attention import IMPLS, resolve_impl
from .rmsnorm import rows_of

__all__ = ["kv_write", "kv_write_torch", "logn_scale", "logn_scale_torch", "silu_mul", "silu_mul_torch"]

BLOCK_L = 16  # query rows a program scales
BLOCK = 1024  # elements a program of the activation computes


def logn_scale_torch(q: torch.Tensor, pos: torch.Tensor, train_len: int) -> torch.Tensor:
    """The reference: ``q`` ``(B, H, L, D)`` times ``max(1, log(pos[..., l] + 1) / log(train_len))`` per
    row, positions ``pos`` ``(L,)`` or ``(B, L)`` (row ``b`` at ``pos[b]``), the scale computed in at
    least float32 and rounded to ``q``'s dtype."""
    acc = torch.promote_types(q.dtype, torch.float32)  # fp16 would round positions past 65519 to inf
    scale = (torch.log(pos.to(acc) + 1) / math.log(train_len)).clamp(min=1.0)[..., None]  # (L, 1) or (B, L, 1)
    if pos.dim() == 2:
        scale = scale[:, None]  # (B, 1, L, 1): a row's scales for each of its heads
    return q * scale.to(q.dtype)


def silu_mul_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The reference: SwiGLU's ``silu(gate) * up``."""
    return F.silu(gate) * up


def kv_write_torch(k_buf: torch.Tensor, v_buf: torch.Tensor, pos: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> None:
    """The reference: ``k, v`` ``(B, Hkv, L, D)`` written into ``k_buf, v_buf`` ``(B, Hkv, S, D)`` at
    positions ``pos`` ``(L,)`` or ``(B, L)`` (row ``b`` at ``pos[b]``), cast to the buffers' dtype
    (indexed assignment: wmtp/kvcache.py)."""
    pos = pos.long()
    if pos.dim() == 1:
        k_buf[:, :, pos] = k.to(k_buf.dtype)
        v_buf[:, :, pos] = v.to(v_buf.dtype)
        return
    rows = torch.arange(k_buf.shape[0], device=pos.device)[:, None]  # (B, 1): each row's batch index
    k_buf[rows, :, pos] = k.to(k_buf.dtype).transpose(1, 2)  # indexed (B, L, Hkv, D)
    v_buf[rows, :, pos] = v.to(v_buf.dtype).transpose(1, 2)


@functools.cache
def _kernels():
    """The Triton kernels, defined on first use (importing wmtp never imports triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _logn_kernel(Q, Pos, Out,  # q (B, H, L, D); pos (L,) or (B, L); out (B, H, L, D) contiguous
                     sb, sh, sl, sp, H, L, n_lblk, T,  # q's strides (its last is 1); pos's batch stride; train_len
                     D: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)  # int64 offsets: B * H * L * D may pass 2**31
        bh = pid // n_lblk
        b, h = bh // H, bh % H
        rows = (pid % n_lblk) * BLOCK_L + tl.arange(0, BLOCK_L)  # (BLOCK_L,)
        cols = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
        mask = (rows < L)[:, None] & (cols < D)[None, :]  # (BLOCK_L, BLOCK_D)
        p = tl.load(Pos + b * sp + rows, mask=rows < L, other=0).to(ACC)  # (BLOCK_L,): row b's positions
        scale = tl.maximum(tl.log(p + 1) / tl.log(T.to(ACC)), 1.0)  # (BLOCK_L,); T an int: no float32 argument
        x = tl.load(Q + b * sb + h * sh + rows.to(tl.int64)[:, None] * sl + cols[None, :], mask=mask, other=0.0)
        s = scale.to(x.dtype).to(ACC)  # rounded to q's dtype first, as the reference
        dst = Out + (bh * L + rows.to(tl.int64))[:, None] * D + cols[None, :]
        tl.store(dst, (x.to(ACC) * s[:, None]).to(x.dtype), mask=mask)

    @triton.jit
    def _silu_mul_kernel(G, U, Out, n, C, sg, su,  # gate, up (R, C), rows sg / su apart; out (n = R * C,)
                         BLOCK: tl.constexpr, ACC: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        row, col = offs // C, offs % C
        g = tl.load(G + row * sg + col, mask=mask, other=0.0)
        u = tl.load(U + row * su + col, mask=mask, other=0.0)
        a = g.to(ACC)
        silu = (a / (1 + tl.exp(-a))).to(g.dtype).to(ACC)  # rounded to g's dtype, as F.silu returns it
        tl.store(Out + offs, (silu * u.to(ACC)).to(g.dtype), mask=mask)

    @triton.jit
    def _kv_write_kernel(K, V, Kb, Vb, Pos,  # k, v (B, Hkv, L, D); buffers (B, Hkv, S, D); pos (L,) or (B, L)
                         skb, skh, skl, svb, svh, svl,  # k's and v's strides (their last is 1)
                         sbb, sbh, sbs, tbb, tbh, tbs, sp,  # the buffers' strides (last 1); pos's batch stride
                         H, L, S, n_lblk, D: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)  # int64 offsets: a buffer may pass 2**31 elements
        bh = pid // n_lblk
        b, h = bh // H, bh % H
        rows = (pid % n_lblk) * BLOCK_L + tl.arange(0, BLOCK_L)  # (BLOCK_L,)
        cols = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
        mask = (rows < L)[:, None] & (cols < D)[None, :]  # (BLOCK_L, BLOCK_D)
        p = tl.load(Pos + b * sp + rows, mask=rows < L, other=0).to(tl.int64)[:, None]  # (BLOCK_L, 1): row b's
        r = rows.to(tl.int64)[:, None]
        k = tl.load(K + b * skb + h * skh + r * skl + cols[None, :], mask=mask)
        v = tl.load(V + b * svb + h * svh + r * svl + cols[None, :], mask=mask)
        inside = mask & (p >= 0) & (p < S)  # a position outside the buffer writes nothing
        tl.store(Kb + b * sbb + h * sbh + p * sbs + cols[None, :], k.to(Kb.dtype.element_ty), mask=inside)
        tl.store(Vb + b * tbb + h * tbh + p * tbs + cols[None, :], v.to(Vb.dtype.element_ty), mask=inside)

    return _logn_kernel, _silu_mul_kernel, _kv_write_kernel


def acc_type(dtype: torch.dtype):
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def on_device(x: torch.Tensor):
    """Triton launches on the current device: make ``x``'s current (no-op off CUDA)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def logn_scale_triton(q: torch.Tensor, pos: torch.Tensor, train_len: int) -> torch.Tensor:
    """``logn_scale_torch`` with a program per ``BLOCK_L`` rows of a head (CUDA, or the CPU
    interpreter). Unchecked: ``logn_scale`` checks first; ``pos`` ``(L,)`` or ``(B, L)``, contiguous in
    its last dimension. Returns a contiguous ``(B, H, L, D)``."""
    import triton

    if q.stride(-1) != 1:
        q = q.contiguous()
    B, H, L, D = q.shape
    out = torch.empty((B, H, L, D), dtype=q.dtype, device=q.device)  # (B, H, L, D)
    if out.numel():
        n_lblk = triton.cdiv(L, BLOCK_L)
        sp = pos.stride(0) if pos.dim() == 2 else 0  # one row of positions for every batch row: stride 0
        with on_device(q):
            _kernels()[0][(n_lblk * B * H,)](q, pos, out, q.stride(0), q.stride(1), q.stride(2), sp, H, L, n_lblk,
                                             train_len, D=D, BLOCK_L=BLOCK_L, BLOCK_D=triton.next_power_of_2(D),
                                             ACC=acc_type(q.dtype))
    return out


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu_mul_torch`` in one kernel (CUDA, or the CPU interpreter). Unchecked: ``silu_mul`` checks
    first. Returns a contiguous tensor of ``gate``'s shape. Reads rows of ``gate`` and ``up`` in place
    when they are evenly spaced with contiguous last dims (the halves of one stacked product:
    wmtp/stacked.py), else from contiguous copies."""
    import triton

    if gate.dim() == 0:  # one element: as a row of one
        return silu_mul_triton(gate[None], up[None])[0]
    out = torch.empty_like(gate, memory_format=torch.contiguous_format)
    if out.numel():
        C = gate.shape[-1]
        g, u = rows_of(gate), rows_of(up)  # (R, C) each, last stride 1
        with on_device(gate):
            _kernels()[1][(triton.cdiv(out.numel(), BLOCK),)](g, u, out, out.numel(), C, g.stride(0), u.stride(0),
                                                              BLOCK=BLOCK, ACC=acc_type(gate.dtype))
    return out


def kv_write_triton(k_buf: torch.Tensor, v_buf: torch.Tensor, pos: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> None:
    """``kv_write_torch`` in one kernel, a program per ``BLOCK_L`` rows of a head (CUDA, or the CPU
    interpreter). Unchecked: ``kv_write`` checks first; ``pos`` ``(L,)`` or ``(B, L)``, contiguous in its
    last dimension."""
    import triton

    k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (k, v))
    B, H, L, D = k.shape
    if k.numel():
        n_lblk = triton.cdiv(L, BLOCK_L)
        sp = pos.stride(0) if pos.dim() == 2 else 0  # one row of positions for every batch row: stride 0
        with on_device(k):
            _kernels()[2][(n_lblk * B * H,)](k, v, k_buf, v_buf, pos, *k.stride()[:3], *v.stride()[:3],
                                             *k_buf.stride()[:3], *v_buf.stride()[:3], sp, H, L, k_buf.shape[2],
                                             n_lblk, D=D, BLOCK_L=BLOCK_L, BLOCK_D=triton.next_power_of_2(D))


def kv_write(k_buf: torch.Tensor, v_buf: torch.Tensor, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             impl: str = "auto") -> None:
    """Write a layer's keys and values ``k, v`` ``(B, Hkv, L, D)`` into its cache buffers ``k_buf,
    v_buf`` ``(B, Hkv, S, D)`` at positions ``pos`` ``(L,)`` or ``(B, L)`` (row ``b`` at ``pos[b]``), cast
    to the buffers' dtype. The caller checks the positions' range (``KVCache.update``): here the kernel
    writes nothing for a position outside ``[0, S)``, where the reference wraps a negative one and
    raises for one past the end.

    Args:
        impl: as ``logn_scale``'s (the kernel when ``"auto"`` on CUDA and ``k, v`` need no gradient).

    Raises:
        ValueError: for another ``impl``; tensors of other shapes or devices, buffers whose last
            dimension is strided, positions not int32 or int64; and for ``"triton"`` a gradient or a
            device where the kernel cannot run.
    """
    check_kv_write(k_buf, v_buf, pos, k, v)
    if route(impl, "kv_write", k, v) == "torch":
        return kv_write_torch(k_buf, v_buf, pos, k, v)
    return kv_write_triton(k_buf, v_buf, pos.contiguous(), k, v)


def check_kv_write(k_buf: torch.Tensor, v_buf: torch.Tensor, pos: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, op: str = "kv_write") -> None:
    """``kv_write``'s checks (and ``qkv_write``'s, wmtp/qkv_write.py: ``op`` names the op in the
    errors), from shapes, strides, dtypes and devices only."""
    B, H, L, D = k.shape if k.dim() == 4 else (None,) * 4
    if (k.dim() != 4 or v.shape != k.shape or k_buf.shape[:2] != (B, H) or k_buf.dim() != 4
            or k_buf.shape[3] != D or v_buf.shape != k_buf.shape or pos.shape not in ((L,), (B, L))):
        raise ValueError(f"{op} takes k, v (B, Hkv, L, D), buffers (B, Hkv, S, D) and pos (L,) or (B, L); got k "
                         f"{tuple(k.shape)}, v {tuple(v.shape)}, buffers {tuple(k_buf.shape)}, "
                         f"{tuple(v_buf.shape)}, pos {tuple(pos.shape)}")
    if pos.dtype not in (torch.int32, torch.int64) or len({t.device for t in (k_buf, v_buf, pos, k, v)}) != 1:
        raise ValueError(f"{op}'s pos must be int32 or int64 and every tensor on one device; got pos {pos.dtype} "
                         f"and devices {[str(t.device) for t in (k_buf, v_buf, pos, k, v)]}")
    if k_buf.stride(-1) != 1 or v_buf.stride(-1) != 1:
        raise ValueError(f"{op}'s buffers must be contiguous in their last dimension")


def route(impl: str, op: str, *xs: torch.Tensor) -> str:
    """``impl`` for an op without a backward on tensors ``xs``: ``"auto"`` takes the reference under
    autograd."""
    if impl not in IMPLS:
        raise ValueError(f"{op} takes impl 'auto', 'torch' or 'triton', got {impl!r}")
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in xs)
    impl = resolve_impl("torch" if impl == "auto" and grad else impl, xs[0].device)  # where the kernel can run
    if impl == "triton" and grad:
        raise ValueError(f"{op}'s impl='triton' has no backward: a tensor needs a gradient (use impl='torch', "
                         "or no_grad)")
    return impl


def logn_scale(q: torch.Tensor, pos: torch.Tensor, train_len: int, impl: str = "auto") -> torch.Tensor:
    """Scale each query row by ``max(1, log(pos + 1) / log(train_len))`` (log-length scaling).

    Args:
        q: ``(B, H, L, D)`` floating, any layout.
        pos: ``(L,)`` or ``(B, L)`` (row ``b`` at ``pos[b]``) integer positions (int32 or int64) on
            ``q``'s device.
        train_len: the training context, an int >= 2.
        impl: ``"torch"`` (the reference), ``"triton"`` (one kernel; CUDA, or CPU tensors under
            ``TRITON_INTERPRET=1``; no backward), or ``"auto"``: the kernel for CUDA tensors when
            triton imports and ``q`` needs no gradient, else the reference.

    Returns:
        ``(B, H, L, D)`` in ``q``'s dtype.

    Raises:
        ValueError: for another ``impl``, shape, dtype or device (for every impl; no device value is
            read), a ``train_len`` below 2, and for ``"triton"`` a gradient or a device where the
            kernel cannot run.
    """
    if q.dim() != 4 or not q.is_floating_point():
        raise ValueError(f"logn_scale takes a floating q of shape (B, H, L, D), got {tuple(q.shape)} {q.dtype}")
    B, L = q.shape[0], q.shape[2]
    if pos.shape not in ((L,), (B, L)) or pos.dtype not in (torch.int32, torch.int64) or pos.device != q.device:
        raise ValueError(f"logn_scale's pos must be ({L},) or ({B}, {L}) int32 or int64 on {q.device}; got "
                         f"{tuple(pos.shape)} {pos.dtype} on {pos.device}")
    if isinstance(train_len, bool) or not isinstance(train_len, int) or train_len < 2:
        raise ValueError(f"logn_scale's train_len must be an int >= 2, got {train_len!r}")
    if route(impl, "logn_scale", q) == "torch":
        return logn_scale_torch(q, pos, train_len)
    return logn_scale_triton(q, pos.contiguous(), train_len)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """SwiGLU's activation ``silu(gate) * up``.

    Args:
        gate, up: floating tensors of one shape, dtype and device, any layout.
        impl: as ``logn_scale``'s (the kernel when ``"auto"`` on CUDA and neither needs a gradient).

    Returns:
        A tensor of ``gate``'s shape and dtype.

    Raises:
        ValueError: for another ``impl``, mismatched tensors, and for ``"triton"`` a gradient or a
            device where the kernel cannot run.
    """
    if not gate.is_floating_point() or (gate.shape, gate.dtype, gate.device) != (up.shape, up.dtype, up.device):
        raise ValueError(f"silu_mul takes floating gate and up of one shape, dtype and device; got "
                         f"{tuple(gate.shape)} {gate.dtype} on {gate.device} and {tuple(up.shape)} {up.dtype} "
                         f"on {up.device}")
    if route(impl, "silu_mul", gate, up) == "torch":
        return silu_mul_torch(gate, up)
    return silu_mul_triton(gate, up)
