"""A layer's query preparation and cache write as one op (wmtp/qkv_write.py): against the separate
ops of the same impl bit for bit (``rope_pair``, ``logn_scale``, ``kv_write``), against float64 truth,
in one parametrized test over both impls; the caches' ``update_qkv``; the model takes it on CUDA.

Tolerance: the kernel rule of NOTE [Tolerances] in tests/attention_truth.py (``assert_op_close``);
the truth takes the op's own angles (tests/test_rope.py says why) and computes the rest in float64.
The Triton cases run on CUDA, or on CPU tensors under Triton's interpreter (no bf16 there).
"""

import math

import pytest
import torch
from attention_truth import assert_op_close
from op_impls import CUDA, DEVICE, IMPLS, INTERPRETED

import wmtp
from wmtp.fused import kv_write
from wmtp.qkv_write import prepare_qk, qkv_write, qkv_write_torch
from wmtp.rope import rope_frequencies

DTYPES = [torch.float32, torch.float64, torch.float16] + ([torch.bfloat16] if CUDA else [])
KERNEL = pytest.mark.skipif(not (CUDA or INTERPRETED), reason="needs CUDA or TRITON_INTERPRET=1")


def _layer(B, Hq, Hkv, L, D, dtype, seed):
    """``q, k, v`` as the stacked q/k/v product leaves them: neighbouring heads of one tensor, views."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(B, L, (Hq + 2 * Hkv) * D, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    heads = y.view(B, L, Hq + 2 * Hkv, D).transpose(1, 2)  # (B, Hq + 2 Hkv, L, D)
    return heads[:, :Hq], heads[:, Hq:Hq + Hkv], heads[:, Hq + Hkv:]


def _truth(x, pos, f, train_len):
    """The preparation in float64 (the angles the op's own: ``pos * f`` in ``f``'s dtype)."""
    x = x.double()
    if f is not None:
        a = (pos.to(f.dtype)[:, None] * f[None, :]).double()  # (L, D/2)
        x1, x2 = x.chunk(2, dim=-1)
        x = torch.cat([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], dim=-1)
    if train_len is not None:
        x = x * (torch.log(pos.double() + 1) / math.log(train_len)).clamp(min=1.0)[:, None]
    return x


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotate,train_len", [(True, None), (False, 256), (True, 7), (False, None)])
@pytest.mark.parametrize("B,Hq,Hkv,L,D,S", [(1, 1, 1, 1, 4, 8), (2, 4, 2, 17, 6, 40), (1, 8, 2, 16, 64, 300),
                                            (1, 2, 2, 5, 128, 9)])
def test_qkv_write_is_the_separate_ops(impl, dtype, rotate, train_len, B, Hq, Hkv, L, D, S):
    """Rows not a multiple of the kernel's block (17, 5), a head_dim not a power of two (6, three
    rotated pairs), GQA, positions in any order up to 299 (scales above 1 for T = 7 and 256): the
    queries and both buffers bit for bit the separate ops' of the same impl, every other cache row
    untouched, and the queries and keys within the kernel rule of float64 truth."""
    q, k, v = _layer(B, Hq, Hkv, L, D, dtype, seed=B * L + D)
    g = torch.Generator().manual_seed(D)
    pos = torch.randperm(S, generator=g)[:L].to(DEVICE)  # (L,)
    f = rope_frequencies(D, 10000.0, DEVICE, torch.promote_types(dtype, torch.float32)) if rotate else None
    bufs = torch.randn(2, B, Hkv, S, D, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    want = bufs.clone()
    want_q, want_k = prepare_qk(q, k, pos, f, train_len, impl)
    kv_write(want[0], want[1], pos, want_k, v, impl)
    for p in (pos, pos.int()):
        got = bufs.clone()
        got_q = qkv_write(q, k, v, p, got[0], got[1], f, train_len, impl)
        assert torch.equal(got_q, want_q) and torch.equal(got, want)
    assert got_q.shape == q.shape and got_q.dtype == dtype
    ref = bufs.clone()
    ref_q = qkv_write_torch(q, k, v, pos, ref[0], ref[1], f, train_len)
    assert_op_close(got_q, ref_q, _truth(q, pos, f, train_len))
    assert_op_close(got[0][:, :, pos], ref[0][:, :, pos], _truth(k, pos, f, None))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("rotate,train_len", [(True, None), (False, 256), (True, 7), (False, None)])
def test_qkv_write_takes_positions_per_batch_row(impl, dtype, rotate, train_len):
    """Positions ``(B, L)``, each sequence of a batch at its own (batched speculative decoding), rows
    far apart in the cache, ``L`` not a multiple of the kernel's block, GQA, a head_dim of three
    rotated pairs, int32: the queries and buffers bit for bit what the op gives each row alone at
    ``pos[b]`` (a program takes one row) and the separate ops' with the same positions, every other
    cache row untouched; ``(1, L)`` positions are ``(L,)`` ones."""
    B, Hq, Hkv, L, D, S = 3, 4, 2, 21, 6, 300
    q, k, v = _layer(B, Hq, Hkv, L, D, dtype, seed=7)
    g = torch.Generator().manual_seed(8)
    pos = torch.stack([b * 135 + torch.randperm(30, generator=g)[:L] for b in range(B)]).to(DEVICE)  # (B, L)
    f = rope_frequencies(D, 10000.0, DEVICE, torch.promote_types(dtype, torch.float32)) if rotate else None
    bufs = torch.randn(2, B, Hkv, S, D, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    want, rows = bufs.clone(), []
    for b in range(B):  # row b alone, into its own rows of the buffers
        rows.append(qkv_write(q[b:b + 1], k[b:b + 1], v[b:b + 1], pos[b], want[0, b:b + 1], want[1, b:b + 1], f,
                              train_len, impl))
    for p in (pos, pos.int()):
        got = bufs.clone()
        got_q = qkv_write(q, k, v, p, got[0], got[1], f, train_len, impl)
        assert torch.equal(got_q, torch.cat(rows)) and torch.equal(got, want)
    kept = ~torch.zeros(B, S, dtype=torch.bool, device=DEVICE).scatter_(1, pos, True)  # (B, S): rows not written
    assert torch.equal(got.transpose(2, 3)[:, kept], bufs.transpose(2, 3)[:, kept])  # (2, n, Hkv, D) each
    apart = bufs.clone()
    apart_q, apart_k = prepare_qk(q, k, pos, f, train_len, impl)
    kv_write(apart[0], apart[1], pos, apart_k, v, impl)
    assert torch.equal(got_q, apart_q) and torch.equal(got, apart)
    one, flat = bufs.clone(), bufs.clone()
    one_q = qkv_write(q[:1], k[:1], v[:1], pos[:1], one[0, :1], one[1, :1], f, train_len, impl)
    assert torch.equal(one_q, qkv_write(q[:1], k[:1], v[:1], pos[0], flat[0, :1], flat[1, :1], f, train_len, impl))
    assert torch.equal(one, flat)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,buf_dtype", [(torch.float16, torch.float32), (torch.float32, torch.float16),
                                             (torch.float64, torch.float32)])
@pytest.mark.parametrize("rotate,train_len", [(True, None), (False, 256), (True, 7)])
def test_the_cache_dtype_is_cast_last(impl, dtype, buf_dtype, rotate, train_len):
    """A cache of another dtype than the layer's (``new_cache(dtype=...)``): the keys rounded to the
    layer's dtype after the rotation, then cast, as the separate ops do, bit for bit."""
    q, k, v = _layer(2, 4, 2, 5, 8, dtype, seed=11)
    pos = torch.tensor([9, 0, 4, 7, 2], device=DEVICE)
    f = rope_frequencies(8, 10000.0, DEVICE, torch.promote_types(dtype, torch.float32)) if rotate else None
    bufs = torch.randn(2, 2, 2, 10, 8, generator=torch.Generator().manual_seed(12)).to(DEVICE, buf_dtype)
    want = bufs.clone()
    want_q, want_k = prepare_qk(q, k, pos, f, train_len, impl)
    kv_write(want[0], want[1], pos, want_k, v, impl)
    got = bufs.clone()
    assert torch.equal(qkv_write(q, k, v, pos, got[0], got[1], f, train_len, impl), want_q)
    assert torch.equal(got, want) and got.dtype == buf_dtype


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("D,rotate,train_len", [(8, True, 300), (5, False, 300), (6, True, None), (1, False, 300)])
def test_strided_rows_and_an_odd_head_dim(impl, D, rotate, train_len):
    """Inputs strided in their last dimension (copied to a contiguous layout first), an odd head_dim
    (scaled, not rotated), down to 1 (no rotated pair at all): the separate ops' bits; without
    preparation ``q`` comes back as it was."""
    g = torch.Generator().manual_seed(D)
    y = torch.randn(3, 1, 4, 6, 2 * D, generator=g, dtype=torch.float64).to(DEVICE, torch.float32)
    q, k, v = (t[..., ::2].transpose(1, 2) for t in y)  # (1, 6, 4, D) each: last stride 2
    q, k = q[:, :4], k[:, :2]
    v = v[:, :2]
    pos = torch.tensor([301, 5, 0, 1000], device=DEVICE)
    f = rope_frequencies(D, 10000.0, DEVICE, torch.float32) if rotate else None
    bufs = torch.zeros(2, 1, 2, 1001, D, device=DEVICE)
    want = bufs.clone()
    want_q, want_k = prepare_qk(q, k, pos, f, train_len, impl)
    kv_write(want[0], want[1], pos, want_k, v, impl)
    got = bufs.clone()
    assert q.stride(-1) == 2 and torch.equal(qkv_write(q, k, v, pos, got[0], got[1], f, train_len, impl), want_q)
    assert torch.equal(got, want)
    assert qkv_write(q, k, v, pos, got[0], got[1], None, None, impl) is q


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("rotate,train_len", [(True, 7), (False, 256)])
def test_every_tensor_is_read_and_written_at_its_own_strides(impl, rotate, train_len):
    """``q``, ``k``, ``v``, both buffers and ``pos`` each of another layout (``q`` contiguous, ``k`` and
    ``v`` transposed views of two different orders, the buffers slices of two larger tensors whose
    strides differ (each buffer's indices at the other's strides still inside its storage, so a mix-up
    fails rather than writes out of bounds), the positions every other entry of a longer tensor,
    ``(L,)`` and ``(B, L)``): the queries and buffers bit for bit the separate ops' of the same impl."""
    B, Hq, Hkv, L, D, S = 2, 4, 2, 5, 6, 12
    g = torch.Generator().manual_seed(5)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(DEVICE, torch.float32)

    q = randn(B, Hq, L, D)  # contiguous
    k = randn(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D): heads D apart
    v = randn(Hkv, B, L, D).transpose(0, 1)  # (B, Hkv, L, D): batch rows L * D apart
    f = rope_frequencies(D, 10000.0, DEVICE, torch.float32) if rotate else None
    k_long, v_long = randn(B + 1, Hkv, S + 3, D), randn(B, Hkv, S + 5, D)  # buffers [:B, :, :S], [:, :, :S]
    order = torch.randperm(S, generator=g).to(DEVICE)
    rows = torch.stack([order, order.flip(0)])  # (B, S), sliced on the device (.to(cuda) of a view copies it)
    for pos in (rows[0, :2 * L:2], rows[:, :2 * L:2]):  # (L,), (B, L): last stride 2
        assert pos.stride(-1) == 2 and len({q.stride(), k.stride(), v.stride()}) == 3
        want_k, want_v, got_k, got_v = k_long.clone(), v_long.clone(), k_long.clone(), v_long.clone()
        want_q, rotated = prepare_qk(q, k, pos, f, train_len, impl)
        kv_write(want_k[:B, :, :S], want_v[:, :, :S], pos, rotated, v, impl)
        got_q = qkv_write(q, k, v, pos, got_k[:B, :, :S], got_v[:, :, :S], f, train_len, impl)
        assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@KERNEL
def test_the_rotating_kernel_writes_nothing_outside_the_buffers():
    """As the next two tests, with rotated keys (their own masked stores): per-row positions outside
    ``[0, S)`` write no key or value; the rows inside hold ``rope_pair``'s keys and the values."""
    bufs = torch.zeros(2, 3, 2, 2, 8, 4, device=DEVICE)  # (k|v, layers, B, Hkv, S, D)
    q, k = torch.ones(2, 2, 3, 4, device=DEVICE), torch.ones(2, 2, 3, 4, device=DEVICE)
    pos = torch.tensor([[-1, 8, 3], [5, -1, 16]], device=DEVICE)
    f = rope_frequencies(4, 10000.0, DEVICE, torch.float32)
    qkv_write(q, k, 2 * k, pos, bufs[0, 1], bufs[1, 1], f, None, "triton")
    _, rotated = prepare_qk(q, k, pos.clamp(0, 7), f, None, "triton")  # (2, 2, 3, 4): [0, :, 2] at 3, [1, :, 0] at 5
    want = torch.zeros_like(bufs)
    want[0, 1, 0, :, 3], want[1, 1, 0, :, 3] = rotated[0, :, 2], 2.0
    want[0, 1, 1, :, 5], want[1, 1, 1, :, 5] = rotated[1, :, 0], 2.0
    assert torch.equal(bufs, want) and rotated[0, :, 2].ne(1.0).all()


@KERNEL
def test_the_kernel_writes_nothing_outside_the_buffers():
    """A negative position and one past the end (which the cache's range check refuses first) write no
    key or value, not the neighbouring head's or layer's rows; their queries are still prepared."""
    bufs = torch.zeros(2, 3, 1, 2, 8, 4, device=DEVICE)  # (k|v, layers, B, Hkv, S, D)
    q, k = torch.ones(1, 2, 3, 4, device=DEVICE), torch.ones(1, 2, 3, 4, device=DEVICE)
    pos = torch.tensor([-1, 8, 3], device=DEVICE)
    got_q = qkv_write(q, k, 2 * k, pos, bufs[0, 1], bufs[1, 1], None, 2, "triton")
    want = torch.zeros_like(bufs)
    want[0, 1, :, :, 3], want[1, 1, :, :, 3] = 1.0, 2.0
    assert torch.equal(bufs, want)
    scale = [1.0, math.log(9) / math.log(2), math.log(4) / math.log(2)]  # log(0) / log(2) = -inf: clamped to 1
    assert torch.allclose(got_q[0, :, :, 0].cpu(), torch.tensor([scale] * 2), rtol=1e-6, atol=0)


@KERNEL
def test_the_kernel_writes_nothing_outside_the_buffers_per_row():
    """Per-row positions ``(B, L)`` outside ``[0, S)`` write no key or value, not the neighbouring
    row's, head's or layer's rows; each row's positions inside are written at that row, and every
    row's queries are scaled by its own positions."""
    bufs = torch.zeros(2, 3, 2, 2, 8, 4, device=DEVICE)  # (k|v, layers, B, Hkv, S, D)
    q, k = torch.ones(2, 2, 3, 4, device=DEVICE), torch.ones(2, 2, 3, 4, device=DEVICE)
    pos = torch.tensor([[-1, 8, 3], [5, -1, 16]], device=DEVICE)
    got_q = qkv_write(q, k, 2 * k, pos, bufs[0, 1], bufs[1, 1], None, 2, "triton")
    want = torch.zeros_like(bufs)
    want[0, 1, 0, :, 3], want[1, 1, 0, :, 3] = 1.0, 2.0
    want[0, 1, 1, :, 5], want[1, 1, 1, :, 5] = 1.0, 2.0
    assert torch.equal(bufs, want)
    scale = [[1.0, math.log(9) / math.log(2), math.log(4) / math.log(2)],  # log(0) / log(2) = -inf: clamped to 1
             [math.log(6) / math.log(2), 1.0, math.log(17) / math.log(2)]]
    assert torch.allclose(got_q[:, :, :, 0].cpu(), torch.tensor(scale)[:, None].expand(2, 2, 3), rtol=1e-6, atol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_without_preparation_the_queries_are_returned_as_they_are(impl):
    q, k, v = _layer(1, 4, 2, 3, 8, torch.float32, seed=1)
    bufs = torch.zeros(2, 1, 2, 5, 8, device=DEVICE)
    assert qkv_write(q, k, v, torch.arange(3, device=DEVICE), bufs[0], bufs[1], None, None, impl) is q
    assert torch.equal(bufs[1, :, :, :3], v) and not bufs[:, :, :, 3:].any()


@pytest.mark.parametrize("impl", IMPLS)
def test_every_cache_prepares_and_writes_alike(impl):
    """``update_qkv``: the contiguous cache's one op, and the ring's and the paged cache's separate
    ops then ``update``, give the same queries and store the same keys and values."""
    target, head = (m.to(DEVICE) for m in wmtp.build_models("tiny", seed=0))
    c = target.config
    q, k, v = _layer(2, c.n_heads, c.n_kv_heads, 3, c.head_dim, torch.float32, seed=2)
    pos = torch.tensor([7, 2, 5], device=DEVICE)
    f = rope_frequencies(c.head_dim, c.rope_theta, DEVICE, torch.float32)
    full, paged = target.new_cache(2, 10), head.new_cache(2, 10, page_size=4)
    ring = head.new_cache(2, 10, ring=(2, 4, 3))
    want_q, want_k = prepare_qk(q, k, pos, f, None, impl)
    for cache in (full, paged, ring):
        assert torch.equal(cache.update_qkv(0, pos, q, k, v, f, None, impl), want_q)
    assert torch.equal(full.read(0, pos)[0], want_k) and torch.equal(full.read(0, pos)[1], v)
    assert torch.equal(paged.read(0, pos)[0], want_k) and torch.equal(paged.read(0, pos)[1], v)
    twin = head.new_cache(2, 10, ring=(2, 4, 3))
    twin.update(0, pos, want_k, v)
    assert torch.equal(ring.k, twin.k) and torch.equal(ring.v, twin.v)
    with pytest.raises(ValueError, match="do not fit"):
        full.update_qkv(0, pos + 5, q, k, v, f, None, impl)
    with pytest.raises(ValueError, match="layer"):
        full.update_qkv(c.n_layers, pos, q, k, v, f, None, impl)


@pytest.mark.parametrize("impl", IMPLS + ["auto"])
def test_bad_input_is_a_value_error_for_every_impl(impl):
    q, k, v = _layer(1, 2, 1, 3, 4, torch.float32, seed=3)
    bufs, pos = torch.zeros(2, 1, 1, 8, 4, device=DEVICE), torch.arange(3, device=DEVICE)
    f = rope_frequencies(4, 10000.0, DEVICE, torch.float32)
    odd = torch.ones(1, 2, 3, 5, device=DEVICE)
    mine, buffers = "qkv_write takes floating q", r"qkv_write takes k, v \(B, Hkv, L, D\), buffers"
    for args, match in (((q[0], k, v, pos, *bufs), mine), ((q[:, :, :2], k, v, pos, *bufs), mine),
                        ((q.long(), k.long(), v.long(), pos, *bufs), mine), ((q, k, v.double(), pos, *bufs), mine),
                        ((q, k, v, pos[:2], *bufs), buffers), ((q, k[:, :, :, :3], v, pos, *bufs), mine),
                        ((q, k, v, pos.float(), *bufs), "qkv_write's pos must be int32 or int64"),
                        ((q, k, v, pos, bufs[0].mT.contiguous().mT, bufs[1]), "qkv_write's buffers must be contiguous"),
                        ((q, k, v, pos, *bufs, f[:1]), "qkv_write's inv_freq"),
                        ((q, k, v, pos, *bufs, f.double()), "qkv_write's inv_freq"),
                        ((odd, odd[:, :1], odd[:, :1], pos, *torch.zeros(2, 1, 1, 8, 5, device=DEVICE), f),
                         "qkv_write takes a floating q .* with D even to rotate"),
                        ((q, k, v, pos, *bufs, None, 1), "qkv_write's train_len"),
                        ((q, k, v, pos, *bufs, None, 8.0), "qkv_write's train_len"),
                        ((q, k, v, pos, *bufs, None, True), "qkv_write's train_len")):
        with pytest.raises(ValueError, match=match):
            qkv_write(*args, impl=impl)
    with pytest.raises(ValueError, match="impl"):
        qkv_write(q, k, v, pos, *bufs, f, None, "cuda")


@pytest.mark.parametrize("impl", IMPLS + ["auto"])
def test_per_row_positions_of_another_shape_are_value_errors(impl):
    """``(B + 1, L)``, ``(B, L + 1)`` and ``(B, 1, L)`` positions: refused by every impl, with or
    without rotation, nothing written."""
    q, k, v = _layer(2, 2, 1, 3, 4, torch.float32, seed=9)
    bufs = torch.zeros(2, 2, 1, 8, 4, device=DEVICE)
    f = rope_frequencies(4, 10000.0, DEVICE, torch.float32)
    for shape in ((3, 3), (2, 4), (2, 1, 3)):
        bad = torch.zeros(shape, dtype=torch.long, device=DEVICE)
        for freqs, train_len in ((f, None), (None, 256), (None, None)):
            with pytest.raises(ValueError, match=r"qkv_write takes k, v .* and pos \(L,\) or \(B, L\); got "):
                qkv_write(q, k, v, bad, *bufs, freqs, train_len, impl)
    assert not bufs.any()


@KERNEL
def test_the_kernel_raises_where_it_has_no_backward():
    """Any of ``q``, ``k``, ``v`` alone needing a gradient is refused by the kernel, nothing written."""
    q, k, v = (x.detach().contiguous().requires_grad_() for x in _layer(1, 2, 1, 3, 4, torch.float32, seed=4))
    k_buf, v_buf = (torch.zeros(1, 1, 8, 4, device=DEVICE) for _ in range(2))  # not views of one tensor
    pos = torch.arange(3, device=DEVICE)
    f = rope_frequencies(4, 10000.0, DEVICE, torch.float32)
    for i in range(3):
        alone = [x if j == i else x.detach() for j, x in enumerate((q, k, v))]
        with pytest.raises(ValueError, match="no backward"):
            qkv_write(*alone, pos, k_buf, v_buf, f, None, "triton")
    assert not k_buf.any() and not v_buf.any()
    qkv_write(q, k, v, pos, k_buf, v_buf, f, None, "auto").sum().backward()  # "auto": the reference
    assert q.grad is not None and k_buf.any()


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the model's Triton ops")
@torch.no_grad()
def test_a_model_pass_on_cuda_prepares_and_writes_in_one_kernel(monkeypatch):
    """With contiguous caches every layer of a target pass and the head's block call ``qkv_write``
    once with the kernel (local layers and the head rotate, global layers scale), and no rotation,
    scaling or write runs apart; with impl='torch' the reference, the same calls; logits close."""
    from wmtp import kvcache
    from wmtp import qkv_write as qkv_mod

    calls, apart = [], []
    plain = kvcache.qkv_write
    monkeypatch.setattr(kvcache, "qkv_write", lambda *a: calls.append((a[-1], a[6] is not None, a[7])) or plain(*a))
    for name in ("rope_pair", "logn_scale"):
        fn = getattr(qkv_mod, name)
        monkeypatch.setattr(qkv_mod, name, lambda *a, name=name, fn=fn: apart.append(name) or fn(*a))
    target, head = (m.cuda().float() for m in wmtp.build_models("tiny", seed=0))
    c = target.config
    ids, pos = torch.arange(8, device="cuda")[None], torch.arange(8, device="cuda")
    want = sorted([(True, None)] * (c.n_layers - len(c.global_layers) + 1) +
                  [(False, c.train_seq_len)] * len(c.global_layers))
    for impl in ("triton", "torch"):
        calls.clear()
        logits, hidden = target(ids, pos, target.new_cache(1, 16), impl=impl)
        head(hidden, ids, pos, head.new_cache(1, 16), impl=impl)
        assert sorted(x[1:] for x in calls) == want and {x[0] for x in calls} == {impl} and not apart
        if impl == "triton":
            fused = logits
    assert (fused - logits).abs().max() <= 1e-3 * logits.abs().max()
