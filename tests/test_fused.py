"""Log-length scaling, SwiGLU's activation and the KV cache write (wmtp/fused.py): each kernel
against its reference in one parametrized test over both impls; the references are the model's
formulas; the model takes the kernels on CUDA.

Tolerance: the kernel rule of NOTE [Tolerances] in tests/attention_truth.py (``assert_op_close``);
the truth is float64 throughout. The Triton cases run on CUDA, or on CPU tensors under Triton's
interpreter (no bf16 there).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from attention_truth import assert_op_close
from fences import fenced
from op_impls import CUDA, DEVICE, IMPLS, INTERPRETED

import wmtp
from wmtp.fused import kv_write, kv_write_torch, logn_scale, logn_scale_torch, silu_mul, silu_mul_torch

DTYPES = [torch.float32, torch.float64, torch.float16] + ([torch.bfloat16] if CUDA else [])


def _randn(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(DEVICE, dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,start,train_len", [((1, 1, 1, 4), 0, 256), ((1, 4, 1, 64), 16383, 256),
                                                   ((2, 3, 17, 32), 200, 256), ((1, 2, 40, 128), 1_000_000, 4096),
                                                   ((1, 1, 5, 6), 70000, 2), ((2, 2, 16, 256), 131071, 8192)])
def test_logn_scale_matches_the_reference(impl, dtype, shape, start, train_len):
    """Rows not a multiple of the kernel's block (17, 40, 5), a head_dim not a power of two (6),
    positions below the training length (scale 1) and up to a million."""
    q = _randn(shape, dtype, sum(shape) + start, 2.0)
    g = torch.Generator().manual_seed(start)
    pos = (start + torch.randperm(shape[2], generator=g)).to(DEVICE)  # (L,), in any order
    truth = q.double() * (torch.log(pos.double() + 1) / math.log(train_len)).clamp(min=1.0)[:, None]
    got = logn_scale(q, pos, train_len, impl)
    assert got.shape == q.shape and got.dtype == dtype and got.device == q.device
    assert_op_close(got, logn_scale_torch(q, pos, train_len), truth)


@pytest.mark.parametrize("impl", IMPLS)
def test_logn_scale_literal_values(impl):
    """T = e^2 rounded to an int is 7: log(7) / log(7) = 1 at position 6; below it the scale is 1."""
    q = torch.ones(1, 1, 4, 2, dtype=torch.float64, device=DEVICE)
    pos = torch.tensor([0, 5, 6, 48], device=DEVICE)  # log(49) / log(7) = 2
    got = logn_scale(q, pos, 7, impl)[0, 0, :, 0].tolist()
    assert got == pytest.approx([1.0, 1.0, 1.0, 2.0], abs=1e-14)


@pytest.mark.parametrize("impl", IMPLS)
def test_logn_scale_reads_any_layout_and_int32_positions(impl):
    """The model's layout (heads a transposed view), a strided slice, int32 and strided positions."""
    y = _randn((2, 9, 3, 16), torch.float64, 1)  # (B, L, H, D)
    every_other = torch.arange(5000, 5018, device=DEVICE)[::2]  # (9,), stride 2
    for x in (y.transpose(1, 2), y.transpose(1, 2)[:, ::2]):
        want = logn_scale_torch(x.contiguous(), every_other.contiguous(), 256)
        for pos in (every_other, every_other.int()):
            got = logn_scale(x, pos, 256, impl)
            assert torch.allclose(got, want, rtol=0, atol=1e-12)
    assert logn_scale(y[:0].transpose(1, 2), every_other, 256, impl).shape == (0, 3, 9, 16)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_logn_scale_takes_positions_per_batch_row(impl, dtype):
    """Positions ``(B, L)``, each sequence of a batch at its own (batched speculative decoding), rows
    far apart (the first below the training length), ``L`` not a multiple of the kernel's block, the
    model's layout, int32: row ``b`` bit for bit what the op gives it alone at ``pos[b]``; ``(1, L)``
    positions are ``(L,)`` ones."""
    B, H, L, D = 3, 2, 21, 8
    q = _randn((B, L, H, D), dtype, 4, 2.0).transpose(1, 2)  # (B, H, L, D), a strided view
    g = torch.Generator().manual_seed(5)
    pos = (torch.tensor([0, 70000, 1_000_000])[:, None] + torch.randperm(L, generator=g)).to(DEVICE)  # (B, L)
    got = logn_scale(q, pos, 256, impl)
    assert got.shape == q.shape and got.dtype == dtype
    for b in range(B):
        assert torch.equal(got[b], logn_scale(q[b:b + 1], pos[b], 256, impl)[0])
    assert not torch.equal(got[2], logn_scale(q[2:], pos[0], 256, impl)[0])  # the rows' positions matter
    assert torch.equal(logn_scale(q, pos.int(), 256, impl), got)
    assert torch.equal(logn_scale(q[:1], pos[:1], 256, impl), logn_scale(q[:1], pos[0], 256, impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (1, 1, 512), (2, 2, 1024), (3, 8, 1000), (2, 5, 4097)])
def test_silu_mul_matches_the_reference(impl, dtype, shape):
    """Sizes below, at, a multiple of and past the kernel's block of 1024, gates far into both tails."""
    gate, up = _randn(shape, dtype, sum(shape), 6.0), _randn(shape, dtype, sum(shape) + 1)
    truth = F.silu(gate.double()) * up.double()
    got = silu_mul(gate, up, impl)
    assert got.shape == gate.shape and got.dtype == dtype and got.device == gate.device
    assert_op_close(got, silu_mul_torch(gate, up), truth)


@pytest.mark.parametrize("impl", IMPLS)
def test_silu_mul_reads_any_layout(impl):
    x = _randn((4, 6, 32), torch.float64, 3)
    gate, up = x[..., :16], x[..., 16:]  # the halves of one tensor: strided views
    assert torch.allclose(silu_mul(gate, up, impl), F.silu(gate) * up, rtol=0, atol=1e-14)
    g, u = gate.transpose(0, 1), x[..., ::2].transpose(0, 1)  # rows not evenly spaced, a strided last dim
    assert torch.allclose(silu_mul(g, u, impl), F.silu(g) * u, rtol=0, atol=1e-14)
    assert silu_mul(gate[:0], up[:0], impl).shape == (0, 6, 16)
    assert torch.allclose(silu_mul(gate[1, 2, 3], up[1, 2, 3], impl), F.silu(gate[1, 2, 3]) * up[1, 2, 3])  # 0-d


@pytest.mark.parametrize("impl", IMPLS)
def test_silu_mul_reads_gate_and_up_at_their_own_row_strides(impl):
    """Rows of ``gate`` and ``up`` evenly spaced but apart by different strides (one contiguous, the
    other every other row of a larger tensor), each way round: both read in place at their own stride."""
    x = _randn((8, 16), torch.float64, 7)
    for gate, up in ((x[:4], x[::2]), (x[::2], x[4:])):  # row strides (16, 32) and (32, 16)
        assert torch.allclose(silu_mul(gate, up, impl), F.silu(gate) * up, rtol=0, atol=1e-14)


@pytest.mark.parametrize("impl", IMPLS)
def test_silu_mul_rounds_the_activation_before_the_product(impl):
    """In float16 ``silu(gate)`` is rounded to float16 before the product, as ``F.silu(gate) * up``
    rounds it: two roundings, literal. Each value here differs from the product of the float32
    activation rounded once (-0.23828125, -0.450927734375, -0.439208984375), with every rounded value
    at least 0.17 of a float16 ulp from a rounding midpoint, so an exponential a few float32 ulps off
    moves none of them."""
    gate = torch.tensor([-4.0, -2.875, -0.375], dtype=torch.float16, device=DEVICE)
    up = torch.tensor([3.3125, 2.9375, 2.875], dtype=torch.float16, device=DEVICE)
    want = torch.tensor([-0.2384033203125, -0.451171875, -0.43896484375], dtype=torch.float16, device=DEVICE)
    assert torch.equal(silu_mul_torch(gate, up), want)
    assert torch.equal(silu_mul(gate, up, impl), want)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,buf_dtype", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                             (torch.float16, torch.float16), (torch.float64, torch.float32),
                                             (torch.float32, torch.float16)])
@pytest.mark.parametrize("B,H,L,D,S", [(1, 1, 1, 4, 8), (2, 3, 17, 6, 40), (1, 2, 16, 64, 100), (3, 1, 5, 128, 9)])
def test_kv_write_is_the_indexed_assignment(impl, dtype, buf_dtype, B, H, L, D, S):
    """Positions in any order (int32 and int64), rows not a multiple of the kernel's block (17, 5), a
    head_dim not a power of two (6), keys and values in the model's transposed layout, a cast to the
    buffers' dtype: the same buffers bit for bit, every other position untouched."""
    g = torch.Generator().manual_seed(B * H * L + D)
    y = torch.randn(2, B, L, H, D, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    k, v = y[0].transpose(1, 2), y[1].transpose(1, 2)  # (B, H, L, D) each, strided views
    pos = torch.randperm(S, generator=g)[:L].to(DEVICE)  # (L,)
    bufs = torch.randn(2, B, H, S, D, generator=g, dtype=torch.float64).to(DEVICE, buf_dtype)
    want = bufs.clone()
    kv_write_torch(want[0], want[1], pos, k, v)
    for p in (pos, pos.int()):
        got = bufs.clone()
        kv_write(got[0], got[1], p, k, v, impl)
        assert torch.equal(got, want)
    empty = bufs.clone()
    kv_write(empty[0], empty[1], pos[:0], k[:, :, :0], v[:, :, :0], impl)  # no rows: nothing written
    assert torch.equal(empty, bufs)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,buf_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float16),
                                             (torch.float64, torch.float32)])
def test_kv_write_takes_positions_per_batch_row(impl, dtype, buf_dtype):
    """Positions ``(B, L)``, each sequence of a batch at its own (batched speculative decoding), rows
    far apart in the buffers, ``L`` not a multiple of the kernel's block, GQA's few key heads, the
    model's layout, int32: the buffers bit for bit what writing each row alone at ``pos[b]`` leaves,
    every other row untouched; ``(1, L)`` positions are ``(L,)`` ones."""
    B, H, L, D, S = 3, 2, 21, 6, 300
    g = torch.Generator().manual_seed(6)
    y = torch.randn(2, B, L, H, D, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    k, v = y[0].transpose(1, 2), y[1].transpose(1, 2)  # (B, H, L, D) each, strided views
    pos = torch.stack([b * 135 + torch.randperm(30, generator=g)[:L] for b in range(B)]).to(DEVICE)  # (B, L)
    bufs = torch.randn(2, B, H, S, D, generator=g, dtype=torch.float64).to(DEVICE, buf_dtype)
    want = bufs.clone()
    for b in range(B):  # row b alone, into its own rows of the buffers
        kv_write(want[0, b:b + 1], want[1, b:b + 1], pos[b], k[b:b + 1], v[b:b + 1], impl)
    for p in (pos, pos.int()):
        got = bufs.clone()
        kv_write(got[0], got[1], p, k, v, impl)
        assert torch.equal(got, want)
    kept = ~torch.zeros(B, S, dtype=torch.bool, device=DEVICE).scatter_(1, pos, True)  # (B, S): rows not written
    assert torch.equal(got.transpose(2, 3)[:, kept], bufs.transpose(2, 3)[:, kept])  # (2, n, H, D) each
    one, flat = bufs.clone(), bufs.clone()
    kv_write(one[0, :1], one[1, :1], pos[:1], k[:1], v[:1], impl)
    kv_write(flat[0, :1], flat[1, :1], pos[0], k[:1], v[:1], impl)
    assert torch.equal(one, flat)


@pytest.mark.skipif(not (CUDA or INTERPRETED), reason="needs CUDA or TRITON_INTERPRET=1")
def test_the_logn_kernel_writes_only_its_output():
    """``_logn_kernel`` launched as ``logn_scale_triton`` launches it, on an output fenced by NaNs
    (tests/fences.py): 5 rows of a 16-row block and a head dim of 48 in a 64-wide block, so its row
    and column masks both cut. A row mask of ``rows <= L`` or a column mask of ``cols < BLOCK_D``
    (mutation round 10's F03, F23) crashed the CPU interpreter instead of failing a test."""
    from wmtp.fused import BLOCK_L, _kernels, acc_type

    q_room = _randn((1, 3, 5, 48), torch.float32, seed=4)  # a spare head past q: reads past it exist
    q, pos = q_room[:, :2], torch.tensor([0, 300, 7, 5000, 255], device=DEVICE)  # (1, 2, 5, 48) (5,)
    out, fences_hold = fenced(torch.empty(1, 2, 5, 48, device=DEVICE))
    _kernels()[0][(2,)](q, pos, out, *q.stride()[:3], 0, 2, 5, 1, 256, D=48, BLOCK_L=BLOCK_L, BLOCK_D=64,
                        ACC=acc_type(torch.float32))  # 2 programs: (b, h) x one block of rows
    assert fences_hold(), "the kernel wrote outside its output"
    assert torch.equal(out, logn_scale(q, pos, 256, "triton"))
    assert_op_close(out, logn_scale_torch(q, pos, 256), logn_scale_torch(q.double(), pos, 256))


@pytest.mark.skipif(not (CUDA or INTERPRETED), reason="needs CUDA or TRITON_INTERPRET=1")
def test_the_kernel_writes_nothing_outside_the_buffers_per_row():
    """Per-row positions ``(B, L)`` outside ``[0, S)`` write nothing, not the neighbouring row's,
    head's or layer's rows; each row's positions inside are written at that row."""
    bufs = torch.zeros(2, 3, 2, 2, 8, 4, device=DEVICE)  # (k|v, layers, B, Hkv, S, D)
    k = torch.ones(2, 2, 3, 4, device=DEVICE)  # (B, Hkv, L, D)
    kv_write(bufs[0, 1], bufs[1, 1], torch.tensor([[-1, 8, 3], [5, -9, 16]], device=DEVICE), k, 2 * k, "triton")
    want = torch.zeros_like(bufs)
    want[0, 1, 0, :, 3], want[1, 1, 0, :, 3] = 1.0, 2.0
    want[0, 1, 1, :, 5], want[1, 1, 1, :, 5] = 1.0, 2.0
    assert torch.equal(bufs, want)


@pytest.mark.skipif(not (CUDA or INTERPRETED), reason="needs CUDA or TRITON_INTERPRET=1")
def test_the_kernel_writes_nothing_outside_the_buffers():
    """A negative position and one past the end (which the caches' range check refuses first) write
    nothing, not the neighbouring head's or layer's rows; the positions inside are written."""
    bufs = torch.zeros(2, 3, 2, 2, 8, 4, device=DEVICE)  # (k|v, layers, B, Hkv, S, D)
    k = torch.ones(2, 2, 3, 4, device=DEVICE)  # (B, Hkv, L, D)
    kv_write(bufs[0, 1], bufs[1, 1], torch.tensor([-1, 8, 3], device=DEVICE), k, 2 * k, "triton")
    want = torch.zeros_like(bufs)
    want[0, 1, :, :, 3], want[1, 1, :, :, 3] = 1.0, 2.0
    assert torch.equal(bufs, want)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_cache_update_writes_with_the_impl_it_is_given(impl):
    """``KVCache.update`` writes the same buffers with either impl; the ring and paged caches take the
    argument (their writes stay indexed assignment) and refuse an unknown one."""
    target, head = (m.to(DEVICE) for m in wmtp.build_models("tiny", seed=0))
    k = torch.randn(2, target.config.n_kv_heads, 3, target.config.head_dim, device=DEVICE)
    pos = torch.tensor([7, 2, 5], device=DEVICE)
    ref, got = target.new_cache(2, 10), target.new_cache(2, 10)
    ref.update(1, pos, k, 2 * k)
    got.update(1, pos, k, 2 * k, impl)
    assert torch.equal(got.k, ref.k) and torch.equal(got.v, ref.v) and got.k[1, :, :, 7].abs().sum() > 0
    host = target.new_cache(2, 10)
    host.update(1, pos.cpu().int(), k, 2 * k, impl)  # positions on the host, as before the kernel
    assert torch.equal(host.k, ref.k) and torch.equal(host.v, ref.v)
    for cache in (head.new_cache(2, 10, ring=(2, 4, 3)), head.new_cache(2, 10, page_size=4)):
        cache.update(0, pos, k, k, impl)
        with pytest.raises(ValueError, match="unknown impl"):
            cache.update(0, pos, k, k, "cuda")
    with pytest.raises(ValueError, match="impl"):
        ref.update(1, pos, k, k, "cuda")


@pytest.mark.parametrize("impl", IMPLS + ["auto"])
def test_bad_kv_writes_are_value_errors(impl):
    bufs, k = torch.zeros(2, 1, 2, 8, 4, device=DEVICE), torch.ones(1, 2, 3, 4, device=DEVICE)
    pos = torch.arange(3, device=DEVICE)
    for args, match in (((bufs[0], bufs[1], pos, k[0], k[0]), r"k, v \(B, Hkv, L, D\)"),
                        ((bufs[0], bufs[1], pos[:2], k, k), r"k, v \(B, Hkv, L, D\)"),
                        ((bufs[0], bufs[1][:, :1], pos, k, k), r"k, v \(B, Hkv, L, D\)"),
                        ((bufs[0, :, :, :, :3], bufs[1, :, :, :, :3], pos, k, k), r"k, v \(B, Hkv, L, D\)"),
                        ((bufs[0], bufs[1], pos, k, k[:, :, :2]), r"k, v \(B, Hkv, L, D\)"),
                        ((bufs[0], bufs[1], pos.float(), k, k), "int32 or int64"),
                        ((bufs[0], bufs[1], pos.cpu() if CUDA else pos.to("meta"), k, k), "on one device"),
                        ((bufs[0].mT.contiguous().mT, bufs[1], pos, k, k), "contiguous in their last"),
                        ((bufs[0], bufs[1].mT.contiguous().mT, pos, k, k), "contiguous in their last")):
        with pytest.raises(ValueError, match=match):
            kv_write(*args, impl=impl)


@pytest.mark.parametrize("impl", IMPLS + ["auto"])
def test_per_row_positions_of_another_shape_are_value_errors(impl):
    """``(B + 1, L)``, ``(B, L + 1)`` and ``(B, 1, L)`` positions: refused by every impl."""
    q, bufs, k = (torch.ones(2, 1, 3, 4, device=DEVICE), torch.zeros(2, 2, 2, 8, 4, device=DEVICE),
                  torch.ones(2, 2, 3, 4, device=DEVICE))
    for shape in ((3, 3), (2, 4), (2, 1, 3)):
        bad = torch.zeros(shape, dtype=torch.long, device=DEVICE)
        with pytest.raises(ValueError, match=r"logn_scale's pos must be \(3,\) or \(2, 3\) int32 or int64"):
            logn_scale(q, bad, 256, impl)
        with pytest.raises(ValueError, match=r"kv_write takes .* and pos \(L,\) or \(B, L\); got "):
            kv_write(bufs[0], bufs[1], bad, k, k, impl)
        assert not bufs.any()


def test_the_references_are_the_models_formulas():
    """Bit for bit what the blocks (wmtp/block.py) computed before the ops existed (CPU results do not move)."""
    q = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([0, 255, 256, 9999, 1_000_000])
    scale = (torch.log(pos.to(torch.float32) + 1) / math.log(256)).clamp(min=1.0)
    assert torch.equal(logn_scale_torch(q, pos, 256), q * scale[:, None])
    q16 = q.half()  # the scale is rounded to q's dtype first, then multiplied: two fp16 roundings, as the kernel
    assert torch.equal(logn_scale_torch(q16, pos, 256), q16 * scale[:, None].half())
    assert not torch.equal(logn_scale_torch(q16, pos, 256), (q16 * scale[:, None]).half())  # not one rounding
    g, u = torch.randn(2, 3, 10), torch.randn(2, 3, 10)
    assert torch.equal(silu_mul_torch(g, u), F.silu(g) * u)


@pytest.mark.parametrize("impl", IMPLS + ["auto"])
def test_bad_input_is_a_value_error_for_every_impl(impl):
    q, pos = torch.ones(1, 1, 2, 4, device=DEVICE), torch.arange(2, device=DEVICE)
    for args, match in (((q[0], pos, 256), "shape \\(B, H, L, D\\)"), ((q.long(), pos, 256), "floating"),
                        ((q, pos[:1], 256), "pos must be \\(2,\\)"), ((q, pos.float(), 256), "int32 or int64"),
                        ((q, pos.cpu() if CUDA else pos.to("meta"), 256), "pos must be"),
                        ((q, pos, 1), "train_len"), ((q, pos, 256.0), "train_len"), ((q, pos, True), "train_len")):
        with pytest.raises(ValueError, match=match):
            logn_scale(*args, impl=impl)
    g = torch.ones(3, 4, device=DEVICE)
    for up in (torch.ones(3, 5, device=DEVICE), g.double(), g.long()):
        with pytest.raises(ValueError, match="one shape, dtype and device"):
            silu_mul(g.long() if up.dtype == torch.long else g, up, impl)
    with pytest.raises(ValueError, match="impl"):
        silu_mul(g, g, "cuda")


@pytest.mark.skipif(not (CUDA or INTERPRETED), reason="needs CUDA or TRITON_INTERPRET=1")
def test_the_kernels_raise_where_they_have_no_backward():
    q = torch.ones(1, 1, 2, 4, device=DEVICE, requires_grad=True)
    pos = torch.arange(2, device=DEVICE)
    with pytest.raises(ValueError, match="no backward"):
        logn_scale(q, pos, 256, "triton")
    g, u = torch.ones(3, device=DEVICE), torch.ones(3, device=DEVICE, requires_grad=True)
    with pytest.raises(ValueError, match="no backward"):
        silu_mul(g, u, "triton")
    logn_scale(q, pos, 256, "auto").sum().backward()  # "auto" takes the reference under autograd
    silu_mul(g, u, "auto").sum().backward()
    assert q.grad is not None and u.grad is not None
    with torch.no_grad():
        assert torch.equal(logn_scale(q, pos, 256, "triton"), logn_scale_torch(q, pos, 256))


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the model's Triton ops")
@torch.no_grad()
def test_a_model_pass_on_cuda_takes_the_kernels(monkeypatch):
    """Every global layer's scaling and every block's activation (the target's and the head's) run
    the kernels with Triton attention, none with impl='torch'. Passes with paged caches: with a
    contiguous cache the scaling and the write are ``qkv_write``'s one kernel (tests/test_qkv_write.py)."""
    from wmtp import block, qkv_write

    calls = []
    plain_logn, plain_silu = qkv_write.logn_scale, block.silu_mul
    monkeypatch.setattr(qkv_write, "logn_scale", lambda q, p, t, impl: calls.append(("logn", impl)) or
                        plain_logn(q, p, t, impl))
    monkeypatch.setattr(block, "silu_mul", lambda g, u, impl: calls.append(("silu", impl)) or plain_silu(g, u, impl))
    target, head = (m.cuda().float() for m in wmtp.build_models("tiny", seed=0))
    n_global, n = len(target.config.global_layers), target.config.n_layers
    ids, pos = torch.arange(8, device="cuda")[None], torch.arange(8, device="cuda")
    logits, hidden = target(ids, pos, target.new_cache(1, 16, page_size=4), impl="triton")
    head(hidden, ids, pos, head.new_cache(1, 16, page_size=4), impl="triton")
    assert sorted(calls) == sorted([("logn", "triton")] * n_global + [("silu", "triton")] * (n + 1)) and n_global
    calls.clear()
    ref, _ = target(ids, pos, target.new_cache(1, 16, page_size=4), impl="torch")
    assert sorted(calls) == sorted([("logn", "torch")] * n_global + [("silu", "torch")] * n)
    assert (logits - ref).abs().max() <= 1e-3 * ref.abs().max()
