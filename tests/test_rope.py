"""RoPE (wmtp/rope.py): the Triton kernel against the reference, one parametrized test over both
impls; the frequencies; the model's rotations (``Attention.frequencies``, ``op_impl``).

Tolerance: the kernel rule of NOTE [Tolerances] in tests/attention_truth.py (``assert_op_close``),
the one statement of it. The truth takes the op's own angles, ``pos * inv_freq`` rounded as the
reference rounds them, and computes the rest in float64: the kernel's angles must then be the
reference's to the bit, since at a million tokens one ulp of a float32 angle is a tenth of a radian.
The Triton cases run on CUDA, or on CPU tensors under Triton's interpreter (no bf16 there).
"""

import math

import pytest
import torch
from attention_truth import assert_op_close
from op_impls import CUDA, DEVICE, IMPLS, INTERPRETED

import wmtp
from wmtp.block import apply_rope
from wmtp.rope import rope, rope_frequencies, rope_pair, rope_torch

DTYPES = [torch.float32, torch.float64, torch.float16] + ([torch.bfloat16] if CUDA else [])


def _acc(dtype):
    return torch.promote_types(dtype, torch.float32)


def _truth(x, pos, f):
    """The rotation in float64 by the op's own angles (``pos * f`` in ``f``'s dtype)."""
    angles = (pos.to(f.dtype)[:, None] * f[None, :]).double()  # (L, D/2), rounded as the reference rounds
    x1, x2 = x.double().chunk(2, dim=-1)
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], dim=-1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,start", [((1, 1, 1, 2), 0), ((1, 4, 1, 64), 16383), ((2, 3, 17, 32), 5),
                                         ((1, 2, 40, 128), 1_000_000), ((1, 1, 5, 6), 0), ((2, 2, 16, 256), 131071)])
def test_rope_matches_the_reference(impl, dtype, shape, start):
    """Rows not a multiple of the kernel's block (17, 40, 5), a half that is not a power of two (3),
    and positions up to a million."""
    g = torch.Generator().manual_seed(sum(shape) + start)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2).to(DEVICE, dtype)
    pos = (start + torch.randperm(shape[2], generator=g)).to(DEVICE)  # (L,), in any order
    f = rope_frequencies(shape[-1], 10000.0, DEVICE, _acc(dtype))
    truth = _truth(x, pos, f)
    got = rope(x, pos, f, impl)
    assert got.shape == x.shape and got.dtype == dtype and got.device == x.device
    assert_op_close(got, rope_torch(x, pos, f), truth)


@pytest.mark.parametrize("impl", IMPLS)
def test_rope_reads_any_layout(impl):
    """The model's layout (heads a transposed view), a strided slice and a copy with a non-unit last
    stride are rotated as their contiguous copies are."""
    g = torch.Generator().manual_seed(1)
    y = torch.randn(2, 9, 3, 16, dtype=torch.float64, generator=g).to(DEVICE)  # (B, L, H, D)
    pos = torch.arange(100, 109, device=DEVICE)
    f = rope_frequencies(16, 500000.0, DEVICE, torch.float64)
    for x in (y.transpose(1, 2), y.transpose(1, 2)[:, ::2], y.transpose(1, 2).transpose(-1, -2).contiguous().mT):
        got = rope(x, pos[: x.shape[2]], f, impl)
        assert got.is_contiguous()
        assert torch.allclose(got, rope_torch(x.contiguous(), pos[: x.shape[2]], f), rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_rope_takes_int32_and_strided_positions_and_empty_tensors(impl):
    x = torch.randn(2, 3, 20, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    f = rope_frequencies(8, 10000.0, DEVICE, torch.float64)
    every_other = torch.arange(1000, 1040, device=DEVICE)[::2]  # (20,), stride 2
    want = rope_torch(x, every_other.contiguous(), f)
    assert torch.allclose(rope(x, every_other, f, impl), want, rtol=0, atol=1e-12)
    assert torch.allclose(rope(x, every_other.int(), f, impl), want, rtol=0, atol=1e-12)
    for empty, pos in ((x[:, :, :0], every_other[:0]), (x[:0], every_other), (x[:, :0], every_other)):
        assert rope(empty, pos, f, impl).shape == empty.shape


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_rope_takes_positions_per_batch_row(impl, dtype):
    """Positions ``(B, L)``, each sequence of a batch at its own (batched speculative decoding), rows
    far apart, ``L`` not a multiple of the kernel's block, three pairs (a row's angles not aligned to
    a vector on a CPU), the model's layout, int32 and strided positions: row ``b`` bit for bit what
    the op gives it alone at ``pos[b]`` (a program of the kernel takes one row); ``rope_pair`` joined
    the same; ``(1, L)`` positions are ``(L,)`` ones."""
    B, H, L, D = 3, 2, 21, 6
    g = torch.Generator().manual_seed(3)
    y = (torch.randn(B, L, 2 * H, D, generator=g, dtype=torch.float64) * 2).to(DEVICE, dtype)  # (B, L, 2H, D)
    x = y.transpose(1, 2)[:, :H]  # (B, H, L, D), a strided view
    pos = (torch.tensor([0, 70000, 1_000_000])[:, None] + torch.randperm(L, generator=g)).to(DEVICE)  # (B, L)
    f = rope_frequencies(D, 10000.0, DEVICE, _acc(dtype))
    got = rope(x, pos, f, impl)
    assert got.shape == x.shape and got.dtype == dtype
    for b in range(B):
        assert torch.equal(got[b], rope(x[b:b + 1], pos[b], f, impl)[0])
    assert not torch.equal(got[1], rope(x[1:2], pos[0], f, impl)[0])  # the rows' positions matter
    wide = torch.stack([pos, pos], dim=-1).view(B, 2 * L)[:, ::2]  # (B, L), strided in its last dimension
    for p in (pos.int(), wide):
        assert torch.equal(rope(x, p, f, impl), got)
    q, k = y.transpose(1, 2)[:, :H], y.transpose(1, 2)[:, H:]  # neighbouring heads: rope_pair joins them
    got_q, got_k = rope_pair(q, k, pos, f, impl)
    assert torch.equal(got_q, got) and torch.equal(got_k, rope(k, pos, f, impl))
    assert torch.equal(rope(x[:1], pos[:1], f, impl), rope(x[:1], pos[0], f, impl))


@pytest.mark.parametrize("impl", IMPLS + ["auto"])
def test_per_row_positions_of_another_shape_are_a_value_error(impl):
    """``(B + 1, L)``, ``(B, L + 1)``, ``(B, 1, L)`` and ``(1, L)`` positions (the kernel would read row 1 of
    positions past the one row given): refused by every impl, pair or not."""
    x, f = torch.ones(2, 1, 5, 4, device=DEVICE), rope_frequencies(4, 10000.0, DEVICE, torch.float32)
    for shape in ((3, 5), (2, 6), (2, 1, 5), (1, 5)):
        bad = torch.zeros(shape, dtype=torch.long, device=DEVICE)
        with pytest.raises(ValueError, match=r"rope's pos must be \(5,\) or \(2, 5\) int32 or int64"):
            rope(x, bad, f, impl)
        with pytest.raises(ValueError, match=r"rope's pos must be \(5,\) or \(2, 5\)"):
            rope_pair(x, x, bad, f, impl)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: 65538 programs are too many for the interpreter")
def test_rope_launches_more_heads_than_a_grid_axis_holds():
    """B * H past 65535, CUDA's cap on a grid's second axis: the kernel's grid has one axis."""
    x = torch.randn(3, 21846, 1, 2, device="cuda")  # 65538 heads
    pos, f = torch.tensor([5], device="cuda"), rope_frequencies(2, 10000.0, "cuda", torch.float32)
    assert torch.allclose(rope(x, pos, f, "triton"), rope_torch(x, pos, f), rtol=0, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_rope_rotates_each_pair_by_its_angle(impl):
    """Literal values: D = 4 at base 100 has frequencies 1 and 1/10; position 2 turns (1, 0) by 2 rad
    and (0, 1) by 0.2 rad."""
    f = rope_frequencies(4, 100.0, DEVICE, torch.float64)
    assert f.tolist() == [1.0, 0.1]
    x = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64, device=DEVICE).view(1, 1, 1, 4)  # pairs (x1, x2)
    got = rope(x, torch.tensor([2], device=DEVICE), f, impl).flatten().tolist()
    want = [math.cos(2), -math.sin(0.2), math.sin(2), math.cos(0.2)]  # (x1 cos - x2 sin, x1 sin + x2 cos)
    assert got == pytest.approx(want, abs=1e-15)


def test_apply_rope_is_the_reference_with_theta_frequencies():
    x = torch.randn(1, 2, 3, 8, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([0, 7, 70000])
    assert torch.equal(apply_rope(x, pos, 10000.0), rope_torch(x, pos, rope_frequencies(8, 10000.0, "cpu",
                                                                                         torch.float32)))
    assert torch.equal(apply_rope(x, pos[:1], 10000.0), x)  # position 0: no turn
    for low in (torch.float16, torch.bfloat16):  # the frequencies in float32 still (at 70000, fp16's are far off)
        want = rope_torch(x.to(low), pos, rope_frequencies(8, 10000.0, "cpu", torch.float32))
        assert torch.equal(apply_rope(x.to(low), pos, 10000.0), want), low


def test_bad_frequencies_are_a_value_error():
    for head_dim in (5, 0, -2):  # 0 would give no frequencies at all, not an error
        with pytest.raises(ValueError, match="must be even and positive"):
            rope_frequencies(head_dim, 10000.0, "cpu", torch.float32)


@pytest.mark.parametrize("impl", IMPLS + ["auto"])
def test_bad_input_is_a_value_error_for_every_impl(impl):
    """Both impls check the same arguments (the reference would broadcast a short pos silently)."""
    x, pos = torch.ones(1, 1, 2, 4, device=DEVICE), torch.arange(2, device=DEVICE)
    f = rope_frequencies(4, 10000.0, DEVICE, torch.float32)
    with pytest.raises(ValueError, match="impl 'auto', 'torch' or 'triton'"):
        rope(x, pos, f, "bogus")
    other = "cpu" if CUDA else "meta"
    for bad_f in (f[:1], f.double(), torch.ones(4, device=DEVICE)[::2], f.to(other)):
        with pytest.raises(ValueError, match="inv_freq must be"):
            rope(x, pos, bad_f, impl)
    for bad_pos in (pos[:1], pos.float(), pos.bool(), pos.to(torch.uint8), pos.to(torch.complex64), pos.to(other)):
        with pytest.raises(ValueError, match="pos must be"):
            rope(x, bad_pos, f, impl)
    for bad_x in (x[0], torch.ones(1, 1, 2, 3, device=DEVICE), x.int()):
        with pytest.raises(ValueError, match=r"floating x of shape \(B, H, L, D\) with D even"):
            rope(bad_x, pos, f, impl)


def test_the_kernel_raises_where_it_has_no_backward():
    x, pos = torch.ones(1, 1, 2, 4), torch.arange(2)
    f = rope_frequencies(4, 10000.0, "cpu", torch.float32)
    assert torch.equal(rope(x, pos, f, "auto"), rope_torch(x, pos, f))  # the reference off CUDA
    if not (CUDA or INTERPRETED):
        return
    x, pos, f = x.to(DEVICE), pos.to(DEVICE), f.to(DEVICE)
    with pytest.raises(ValueError, match="no backward"):
        rope(x.clone().requires_grad_(), pos, f, "triton")
    with torch.no_grad():
        assert rope(x.clone().requires_grad_(), pos, f, "triton").shape == x.shape


def test_auto_takes_the_reference_under_autograd_where_the_kernel_would_serve(monkeypatch):
    """Where ``"auto"`` means the kernel (CUDA; here ``resolve_impl`` says so), a tensor that needs a
    gradient is rotated by the reference, with a backward, not refused as ``impl="triton"`` is."""
    from wmtp import rope as rope_mod

    monkeypatch.setattr(rope_mod, "resolve_impl", lambda impl, device: "triton" if impl == "auto" else impl)
    x = torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(0)).requires_grad_()
    pos, f = torch.arange(3), rope_frequencies(4, 10000.0, "cpu", torch.float32)
    got = rope(x, pos, f, "auto")
    assert got.grad_fn is not None and torch.equal(got, rope_torch(x, pos, f))
    with pytest.raises(ValueError, match="no backward"):
        rope(x, pos, f, "triton")
    fg = f.clone().requires_grad_()  # frequencies that need a gradient: the kernel would drop it
    got = rope(x.detach(), pos, fg, "auto")
    assert got.grad_fn is not None and torch.equal(got, rope_torch(x.detach(), pos, fg))
    with pytest.raises(ValueError, match="^impl='triton' has no backward: x or inv_freq needs a gradient"):
        rope(x.detach(), pos, fg, "triton")


def test_attention_keeps_its_frequencies_per_device_and_dtype():
    target, _ = wmtp.build_models("tiny", seed=0)
    attn = target.layers[0].attn
    c = target.config
    a = attn.frequencies(torch.ones(1, dtype=torch.float32))
    assert attn.frequencies(torch.ones(1, dtype=torch.bfloat16)) is a  # promoted to float32: the same entry
    assert torch.equal(a, rope_frequencies(c.head_dim, c.rope_theta, "cpu", torch.float32))
    b = attn.frequencies(torch.ones(1, dtype=torch.float64))
    assert b.dtype == torch.float64 and b is not a and len(attn._freqs) == 2
    assert not any("freq" in name for name in target.state_dict())  # kept, never saved


@pytest.mark.skipif(not CUDA, reason="needs CUDA: a graph capture")
def test_frequencies_first_asked_for_in_a_capture_are_not_kept():
    target, _ = wmtp.build_models("tiny", seed=0)
    attn = target.layers[0].attn.cuda()
    x = torch.ones(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attn.frequencies(x)
    assert attn._freqs == {}
    f = attn.frequencies(x)
    assert attn._freqs[(x.device, torch.float32)] is f and torch.equal(
        f, rope_frequencies(target.config.head_dim, target.config.rope_theta, "cuda", torch.float32))


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the model's Triton RoPE")
@torch.no_grad()
def test_a_model_pass_on_cuda_rotates_with_the_kernel(monkeypatch):
    """Every rotation of a target pass and a head pass with paged caches (with a contiguous cache the
    rotation is part of ``qkv_write``: tests/test_qkv_write.py) with Triton attention runs the kernel,
    queries and keys of each local layer and of the head's block in one call (their stacked product's
    neighbouring heads: ``rope_pair``); with impl='torch' the reference, two calls a layer."""
    from wmtp import rope as rope_mod

    calls = []
    plain = rope_mod.rope
    monkeypatch.setattr(rope_mod, "rope", lambda x, pos, f, impl: calls.append((impl, x.shape[1])) or
                        plain(x, pos, f, impl))
    target, head = (m.cuda().float() for m in wmtp.build_models("tiny", seed=0))
    c = target.config
    n_local = c.n_layers - len(c.global_layers)
    ids, pos = torch.arange(8, device="cuda")[None], torch.arange(8, device="cuda")
    logits, hidden = target(ids, pos, target.new_cache(1, 16, page_size=4), impl="triton")
    head(hidden, ids, pos, head.new_cache(1, 16, page_size=4), impl="triton")
    assert calls == [("triton", c.n_heads + c.n_kv_heads)] * (n_local + 1) and n_local > 0
    calls.clear()
    ref, _ = target(ids, pos, target.new_cache(1, 16, page_size=4), impl="torch")
    assert calls == [("torch", c.n_heads), ("torch", c.n_kv_heads)] * n_local
    assert (logits - ref).abs().max() <= 1e-3 * ref.abs().max()


@pytest.mark.parametrize("impl", IMPLS)
def test_rope_pair_is_rope_on_each_joined_or_not(impl, monkeypatch):
    """Queries and keys as the stacked q/k/v product leaves them (neighbouring heads of one tensor):
    one rotation call, each output bit for bit ``rope``'s alone; any other pair: two calls."""
    from wmtp import rope as rope_mod

    B, L, Hq, Hkv, D = 2, 5, 4, 2, 16
    g = torch.Generator().manual_seed(0)
    y = torch.randn(B, L, (Hq + 2 * Hkv + 1) * D, generator=g, dtype=torch.float64).to(DEVICE)
    pos = torch.arange(100, 100 + L, device=DEVICE)
    f = rope_frequencies(D, 10000.0, DEVICE, torch.float64)
    heads = y.view(B, L, -1, D).transpose(1, 2)  # (B, Hq + 2 Hkv + 1, L, D) views
    calls = []
    plain = rope_mod.rope
    monkeypatch.setattr(rope_mod, "rope", lambda x, *a: calls.append(x.shape[1]) or plain(x, *a))
    for q, k, joined in [(heads[:, :Hq], heads[:, Hq:Hq + Hkv], True),  # the stacked product's views
                         (heads[:, :Hq], heads[:, Hq + 1:Hq + 1 + Hkv], False),  # a head between them
                         (heads[:, :Hq].contiguous(), heads[:, Hq:Hq + Hkv].contiguous(), False),
                         (heads[:, :Hq], heads[:, Hq:Hq + Hkv].float(), False)]:
        calls.clear()
        got_q, got_k = rope_pair(q, k, pos, f, impl) if k.dtype == q.dtype else (None, None)
        if k.dtype != q.dtype:  # two calls: the second refuses k's frequencies' dtype, as rope does
            with pytest.raises(ValueError, match="inv_freq"):
                rope_pair(q, k, pos, f, impl)
            continue
        assert calls == ([Hq + Hkv] if joined else [Hq, Hkv])
        assert torch.equal(got_q, plain(q, pos, f, impl)) and torch.equal(got_k, plain(k, pos, f, impl))
        assert got_q.shape == q.shape and got_k.shape == k.shape


def test_rope_pair_keeps_both_gradients():
    """Under autograd the pair is rotated as two calls: the joined view's backward would reach q alone."""
    D, Hq, Hkv = 8, 2, 1
    y = torch.randn(1, 3, (Hq + 2 * Hkv) * D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    f = rope_frequencies(D, 10000.0, "cpu", torch.float64)
    pos = torch.arange(3)
    grads = []
    for pair in (rope_pair, lambda q, k, *a: (rope(q, *a), rope(k, *a))):
        leaf = y.clone().requires_grad_()
        heads = leaf.view(1, 3, -1, D).transpose(1, 2)
        q, k = pair(heads[:, :Hq], heads[:, Hq:Hq + Hkv], pos, f, "auto")
        (q.square().sum() + 3 * k.square().sum()).backward()
        grads.append(leaf.grad)
    assert grads[0][..., Hq * D:(Hq + Hkv) * D].abs().sum() > 0 and torch.equal(grads[0], grads[1])


def test_rope_pair_joins_only_a_next_head_of_the_same_shape_and_strides():
    """``k`` starting where ``q``'s next head would, but with fewer positions or in another layout, is no
    joined pair: it is rotated alone (its positions refused, or its own elements read), as ``rope`` does."""
    y = torch.randn(1, 5, 3 * 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    heads = y.view(1, 5, 3, 8).transpose(1, 2)  # (B, 3 heads, L=5, D=8), strides (120, 8, 24, 1)
    q, short = heads[:, :2], heads[:, 2:3, :4]  # short: the third head's first 4 positions
    pos, f = torch.arange(5), rope_frequencies(8, 10000.0, "cpu", torch.float64)
    with pytest.raises(ValueError, match=r"rope's pos must be \(4,\)"):
        rope_pair(q, short, pos, f, "torch")
    other = y.view(-1)[16:56].view(1, 1, 5, 8)  # (1, 1, 5, 8) from the third head's start, strides (40, 40, 8, 1)
    got_q, got_k = rope_pair(q, other, pos, f, "torch")
    assert torch.equal(got_q, rope(q, pos, f, "torch")) and torch.equal(got_k, rope(other, pos, f, "torch"))


def test_rope_pair_joins_no_k_of_another_batch_or_tensor():
    """``k`` starting where ``q``'s next head would, with ``q``'s strides, but of the first batch row only or
    in another tensor, is no joined pair (mutation round 15): rotated alone, it keeps its one row, and its
    own elements are read, not those of ``q``'s tensor at its offset."""
    g = torch.Generator().manual_seed(3)
    y, z = (torch.randn(2, 5, 3 * 8, dtype=torch.float64, generator=g) for _ in range(2))  # two storages
    heads, others = (t.view(2, 5, 3, 8).transpose(1, 2) for t in (y, z))  # (B=2, 3 heads, L=5, D=8)
    q = heads[:, :2]  # strides (120, 8, 24, 1)
    pos, f = torch.arange(5), rope_frequencies(8, 10000.0, "cpu", torch.float64)
    for k in (heads[:1, 2:3], others[:, 2:3]):  # (1, 1, 5, 8) of y; (2, 1, 5, 8) of z, at y's third head's offset
        got_q, got_k = rope_pair(q, k, pos, f, "torch")
        assert got_k.shape == k.shape
        assert torch.equal(got_q, rope(q, pos, f, "torch")) and torch.equal(got_k, rope(k, pos, f, "torch"))
