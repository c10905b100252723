"""A layer's query preparation and cache write as one kernel: rotate (RoPE) or scale (log-length)
the queries, rotate the keys and write them with the values into a contiguous KV cache.

Each attention layer of a decode step (arXiv 2607.21535, Sec. 2 and 5: the target's local and
full-attention layers, the MTP head's block) prepares its queries and keys, then writes its keys and
values into the layer's cache. With the separate ops that is two kernels a layer on a GPU: a local
layer's joint rotation (``rope_pair`` in wmtp/rope.py) or a global layer's scaling (``logn_scale``
in wmtp/fused.py), then the write (``kv_write``). ``qkv_write`` makes both one: its programs take a
block of rows of one head each, a query head's rows to the returned queries, a key head's rotated
keys and its values to the cache at their positions. Inside a CUDA graph each kernel costs a few
microseconds however little it computes (experiment 27: metrics/experiments/kernel-census-h200-exp27-2396f73.json).

The arithmetic is the separate kernels', operation for operation: angles ``position * inv_freq``
from the caller's frequencies, ``x1 cos - x2 sin`` and ``x1 sin + x2 cos`` in at least float32 then
rounded to the input's dtype; the scale ``max(1, log(t + 1) / log(T))`` rounded to the query's dtype
before the product; the cast to the cache's dtype last. So the kernel gives ``rope_pair``,
``logn_scale`` and ``kv_write``'s kernels' bits (tests/test_qkv_write.py) and the reference's to
rounding (wmtp/rope.py says why not to the bit; decoding needs no more: a dense step and a verify
pass prepare with the same op, decode.py NOTE [Exactness]). As ``kv_write``'s, the kernel writes no
position outside ``[0, S)``; the cache checks the range first (``KVCache.update_qkv``).

Only the contiguous cache writes this way; the ring and paged caches keep their indexed writes
after the separate ops (``SeparateWrites`` in wmtp/kvcache.py). The model takes the kernel on CUDA
unless asked for ``impl="torch"`` or a gradient is needed (``op_impl`` in wmtp/block.py). A dense step of the small
preset launches 4 kernels fewer, a one-row head call 1. In the CUDA-graph decode loop on the H200,
every run lossless, dense decoding took 1.6-2.8 % less time a token and speculative decoding
1.1-3.5 % less (metrics/experiments/qkv-write-h200-exp42.json).

Positions may be per row, ``(B, L)`` where they are otherwise ``(L,)``: batched speculative decoding
with each sequence of the batch at its own position; row ``b`` is prepared and written as it would be
alone at ``pos[b]``.
"""

from __future__ import annotations

import functools

import torch

from .fused import acc_type, check_kv_write, kv_write_torch, logn_scale, logn_scale_torch, on_device, route
from .rope import check_rope_args, rope_pair, rope_torch

__all__ = ["prepare_qk", "qkv_write", "qkv_write_torch", "qkv_write_triton"]

BLOCK_L = 16  # rows (positions) a program prepares or writes


def prepare_qk(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor | None,
               train_len: int | None, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The separate ops: ``q, k`` rotated by ``rope_pair`` when ``inv_freq`` is given, then ``q`` scaled
    by ``logn_scale`` when ``train_len`` is, at positions ``pos`` ``(L,)`` or ``(B, L)``; ``impl`` theirs."""
    if inv_freq is not None:
        q, k = rope_pair(q, k, pos, inv_freq, impl)  # (B, Hq, L, D), (B, Hkv, L, D)
    if train_len is not None:
        q = logn_scale(q, pos, train_len, impl)  # (B, Hq, L, D)
    return q, k


def qkv_write_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, k_buf: torch.Tensor,
                    v_buf: torch.Tensor, inv_freq: torch.Tensor | None = None,
                    train_len: int | None = None) -> torch.Tensor:
    """The reference: the separate references one after the other (``rope_torch`` on ``q`` and ``k``,
    ``logn_scale_torch`` on ``q``, ``kv_write_torch``), ``pos`` ``(L,)`` or ``(B, L)``; returns the prepared
    ``q``."""
    if inv_freq is not None:
        q, k = rope_torch(q, pos, inv_freq), rope_torch(k, pos, inv_freq)  # (B, Hq, L, D), (B, Hkv, L, D)
    if train_len is not None:
        q = logn_scale_torch(q, pos, train_len)  # (B, Hq, L, D)
    kv_write_torch(k_buf, v_buf, pos, k, v)  # into (B, Hkv, S, D) each
    return q


@functools.cache
def _kernel():
    """The Triton kernel, defined on first use (importing wmtp never imports triton)."""
    import triton
    import triton.language as tl

    # Outputs: Qo (B, Hq, L, D) contiguous, the prepared queries; Kb, Vb (B, Hkv, S, D), the cache buffers
    @triton.jit
    def _qkv_write_kernel(Q, K, V, Pos, F, Qo, Kb, Vb,  # q (B, Hq, L, D); k, v (B, Hkv, L, D); pos; inv_freq
                          sqb, sqh, sql, skb, skh, skl, svb, svh, svl,  # q's, k's and v's strides (last 1)
                          sbb, sbh, sbs, tbb, tbh, tbs,  # the key and value buffers' strides (last 1)
                          sp,  # pos's batch stride: pos (L,) (0) or (B, L)
                          Hq, Hkv, L, S, n_lblk, T,  # Hq: the query heads prepared (0: none); T: train_len
                          D: tl.constexpr, ROPE: tl.constexpr, LOGN: tl.constexpr, BLOCK_L: tl.constexpr,
                          BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)  # int64 offsets: a buffer may pass 2**31 elements
        bh = pid // n_lblk
        b, h = bh // (Hq + Hkv), bh % (Hq + Hkv)  # heads 0 .. Hq-1 are queries, then the key heads
        rows = (pid % n_lblk) * BLOCK_L + tl.arange(0, BLOCK_L)  # (BLOCK_L,)
        r = rows.to(tl.int64)[:, None]  # (BLOCK_L, 1)
        p = tl.load(Pos + b * sp + rows, mask=rows < L, other=0)  # (BLOCK_L,): row b's positions
        half = tl.arange(0, BLOCK_H)  # (BLOCK_H,): a rotation's pairs, columns c and c + D/2
        hmask = (rows < L)[:, None] & (half < D // 2)[None, :]  # (BLOCK_L, BLOCK_H)
        cols = tl.arange(0, BLOCK_D)  # (BLOCK_D,): a whole row
        mask = (rows < L)[:, None] & (cols < D)[None, :]  # (BLOCK_L, BLOCK_D)
        if ROPE:
            angle = p.to(ACC)[:, None] * tl.load(F + half, mask=half < D // 2, other=0.0)[None, :]  # rope.py's
            cos, sin = tl.cos(angle), tl.sin(angle)  # (BLOCK_L, BLOCK_H) each
        if h < Hq:  # a query head: rotated or scaled, to Qo (B, Hq, L, D) contiguous
            src = Q + b * sqb + h * sqh + r * sql  # (BLOCK_L, 1) row starts
            dst = Qo + ((b * Hq + h) * L + r) * D  # (BLOCK_L, 1)
            if LOGN:  # fused.py's: the scale rounded to q's dtype before the product
                scale = tl.maximum(tl.log(p.to(ACC) + 1) / tl.log(T.to(ACC)), 1.0)  # (BLOCK_L,)
                s = scale.to(Q.dtype.element_ty).to(ACC)[:, None]  # (BLOCK_L, 1)
            if ROPE:
                x1 = tl.load(src + half[None, :], mask=hmask, other=0.0)  # (BLOCK_L, BLOCK_H)
                x2 = tl.load(src + D // 2 + half[None, :], mask=hmask, other=0.0)  # (BLOCK_L, BLOCK_H)
                a1, a2 = x1.to(ACC), x2.to(ACC)
                y1, y2 = (a1 * cos - a2 * sin).to(x1.dtype), (a1 * sin + a2 * cos).to(x1.dtype)  # rope.py's
                if LOGN:
                    y1, y2 = (y1.to(ACC) * s).to(x1.dtype), (y2.to(ACC) * s).to(x1.dtype)
                tl.store(dst + half[None, :], y1, mask=hmask)
                tl.store(dst + D // 2 + half[None, :], y2, mask=hmask)
            else:
                x = tl.load(src + cols[None, :], mask=mask, other=0.0)  # (BLOCK_L, BLOCK_D)
                if LOGN:  # (without either, the launcher passes no query heads)
                    x = (x.to(ACC) * s).to(x.dtype)
                tl.store(dst + cols[None, :], x, mask=mask)
        else:  # a key head: keys (rotated) and values to the buffers at their positions
            hk = h - Hq
            pp = p.to(tl.int64)[:, None]  # (BLOCK_L, 1)
            inside = (pp >= 0) & (pp < S)  # a position outside the buffers writes nothing
            kdst = Kb + b * sbb + hk * sbh + pp * sbs  # (BLOCK_L, 1) the rows' cache rows
            ksrc = K + b * skb + hk * skh + r * skl  # (BLOCK_L, 1)
            if ROPE:
                x1 = tl.load(ksrc + half[None, :], mask=hmask, other=0.0)  # (BLOCK_L, BLOCK_H)
                x2 = tl.load(ksrc + D // 2 + half[None, :], mask=hmask, other=0.0)  # (BLOCK_L, BLOCK_H)
                a1, a2 = x1.to(ACC), x2.to(ACC)
                y1, y2 = (a1 * cos - a2 * sin).to(x1.dtype), (a1 * sin + a2 * cos).to(x1.dtype)  # rope.py's
                tl.store(kdst + half[None, :], y1.to(Kb.dtype.element_ty), mask=hmask & inside)
                tl.store(kdst + D // 2 + half[None, :], y2.to(Kb.dtype.element_ty), mask=hmask & inside)
            else:
                x = tl.load(ksrc + cols[None, :], mask=mask)  # (BLOCK_L, BLOCK_D)
                tl.store(kdst + cols[None, :], x.to(Kb.dtype.element_ty), mask=mask & inside)
            x = tl.load(V + b * svb + hk * svh + r * svl + cols[None, :], mask=mask)  # (BLOCK_L, BLOCK_D)
            tl.store(Vb + b * tbb + hk * tbh + pp * tbs + cols[None, :], x.to(Vb.dtype.element_ty), mask=mask & inside)

    return _qkv_write_kernel


def qkv_write_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, k_buf: torch.Tensor,
                     v_buf: torch.Tensor, inv_freq: torch.Tensor | None = None,
                     train_len: int | None = None) -> torch.Tensor:
    """``qkv_write_torch`` in one kernel, a program per ``BLOCK_L`` rows of a head (CUDA, or the CPU
    interpreter). Unchecked: ``qkv_write`` checks first; ``pos`` ``(L,)`` or ``(B, L)``, contiguous in its
    last dimension. Returns ``q`` itself when neither ``inv_freq`` nor ``train_len`` is given, else a
    contiguous ``(B, Hq, L, D)``."""
    import triton

    prepared = inv_freq is not None or train_len is not None
    out = q if not prepared else torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (B, Hq, L, D)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    B, Hq, L, D = q.shape
    Hkv = k.shape[1]
    Hw = Hq if prepared else 0  # query heads the kernel writes
    if B * L * D and Hw + Hkv:
        n_lblk = triton.cdiv(L, BLOCK_L)
        f = inv_freq if inv_freq is not None else q  # an unread pointer without RoPE
        sp = pos.stride(0) if pos.dim() == 2 else 0  # one row of positions for every batch row: stride 0
        with on_device(q):
            _kernel()[(n_lblk * B * (Hw + Hkv),)](
                q, k, v, pos, f, out, k_buf, v_buf, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                *k_buf.stride()[:3], *v_buf.stride()[:3], sp, Hw, Hkv, L, k_buf.shape[2], n_lblk,
                train_len or 2, D=D, ROPE=inv_freq is not None, LOGN=train_len is not None, BLOCK_L=BLOCK_L,
                BLOCK_H=triton.next_power_of_2(max(D // 2, 1)), BLOCK_D=triton.next_power_of_2(D),
                ACC=acc_type(inv_freq.dtype if inv_freq is not None else q.dtype))
    return out


def qkv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, k_buf: torch.Tensor,
              v_buf: torch.Tensor, inv_freq: torch.Tensor | None = None, train_len: int | None = None,
              impl: str = "auto") -> torch.Tensor:
    """Prepare a layer's queries and write its keys and values: ``q`` and ``k`` rotated by the RoPE
    angles of ``pos`` when ``inv_freq`` is given, ``q`` then scaled by log-length scaling when
    ``train_len`` is, and ``k, v`` written into ``k_buf, v_buf`` at ``pos``, cast to their dtype.

    Args:
        q: ``(B, Hq, L, D)`` queries; ``k, v``: ``(B, Hkv, L, D)``; floating, one dtype, any layout.
        pos: ``(L,)`` or ``(B, L)`` (row ``b`` at ``pos[b]``) int32 or int64 positions, each in ``[0, S)``
            (unchecked here, as ``kv_write``'s).
        k_buf, v_buf: ``(B, Hkv, S, D)`` cache buffers, contiguous in their last dimension.
        inv_freq: ``(D/2,)`` RoPE frequencies (``rope``'s), or ``None``: no rotation.
        train_len: the training context (``logn_scale``'s, an int >= 2), or ``None``: no scaling.
        impl: ``"torch"`` (the reference), ``"triton"`` (one kernel; CUDA, or CPU tensors under
            ``TRITON_INTERPRET=1``; no backward), or ``"auto"``: the kernel for CUDA tensors when
            triton imports and no input needs a gradient, else the reference.

    Returns:
        The prepared queries ``(B, Hq, L, D)`` in ``q``'s dtype (``q`` itself when neither is given).

    Raises:
        ValueError: for another ``impl``; tensors of other shapes, dtypes or devices, frequencies or
            a ``train_len`` the separate ops refuse, buffers ``kv_write`` refuses; and for ``"triton"``
            a gradient or a device where the kernel cannot run.
    """
    if q.dim() != 4 or k.dim() != 4 or q.shape[:1] + q.shape[2:] != k.shape[:1] + k.shape[2:] or (
            not q.is_floating_point() or (q.dtype, q.device) != (k.dtype, k.device) or v.dtype != q.dtype):
        raise ValueError(f"qkv_write takes floating q (B, Hq, L, D) and k, v (B, Hkv, L, D) of one dtype and device; "
                         f"got q {tuple(q.shape)} {q.dtype} on {q.device}, k {tuple(k.shape)} {k.dtype} on "
                         f"{k.device}, v {v.dtype}")
    check_kv_write(k_buf, v_buf, pos, k, v, "qkv_write")  # k, v, the buffers, pos: shapes, dtypes, one device
    if inv_freq is not None:
        check_rope_args(q, pos, inv_freq, "qkv_write", "q")
    if train_len is not None and (isinstance(train_len, bool) or not isinstance(train_len, int) or train_len < 2):
        raise ValueError(f"qkv_write's train_len must be an int >= 2 or None, got {train_len!r}")
    if route(impl, "qkv_write", q, k, v) == "torch":
        return qkv_write_torch(q, k, v, pos, k_buf, v_buf, inv_freq, train_len)
    return qkv_write_triton(q, k, v, pos.contiguous(), k_buf, v_buf, inv_freq, train_len)

