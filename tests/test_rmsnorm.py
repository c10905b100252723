"""RMSNorm (wmtp/rmsnorm.py): the Triton kernel against the reference, one parametrized test over
both impls; the model's choice of impl (``op_impl``).

Tolerance: the kernel rule of NOTE [Tolerances] in tests/attention_truth.py (``assert_op_close``),
the one statement of it. The Triton cases run on CUDA, or on CPU tensors under Triton's
interpreter (float32 and float64 only: the interpreter has no bf16).
"""


import pytest
import torch
from attention_truth import assert_op_close
from op_impls import CUDA, DEVICE, IMPLS, INTERPRETED

import wmtp
from wmtp.block import op_impl
from wmtp.rmsnorm import add_rms_norm, eps_halves, rms_norm, rms_norm_torch

DTYPES = [torch.float32, torch.float64] + ([torch.bfloat16, torch.float16] if CUDA else [])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 16), (1, 3, 100), (2, 8, 256), (5, 64), (3, 1), (2, 768)])
def test_rms_norm_matches_the_reference(impl, dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(DEVICE, dtype)
    w = (1 + torch.randn(shape[-1], generator=g, dtype=torch.float64) / 4).to(DEVICE, dtype)
    truth = rms_norm_torch(x.double(), w.double(), 1e-5)
    got = rms_norm(x, w, 1e-5, impl)
    assert got.shape == x.shape and got.dtype == dtype and got.device == x.device
    assert_op_close(got, rms_norm_torch(x, w, 1e-5), truth)


@pytest.mark.parametrize("impl", IMPLS)
def test_rms_norm_reads_rows_of_any_layout(impl):
    """A strided view (rows not adjacent) and a transposed one (no view reshapes it: a copy) are
    normalised row by row."""
    x = torch.randn(4, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    w = torch.linspace(0.5, 1.5, 32, dtype=torch.float64, device=DEVICE)
    for view in (x[:, ::2], x.transpose(0, 1)[:, 1:3], x[0].T.contiguous().T):  # (4, 3, 32), (6, 2, 32), (6, 32)
        assert torch.allclose(rms_norm(view, w, 1e-6, impl), rms_norm_torch(view, w, 1e-6), rtol=0, atol=1e-12)


ADD_DTYPES = [torch.float32, torch.float64] + ([torch.bfloat16] if CUDA else [torch.float16])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", ADD_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 5, 64), (1, 3, 1000)])
def test_add_rms_norm_is_the_addition_then_the_norm(impl, dtype, shape):
    """NOTE [Pending addition] in wmtp/block.py: the fused sum is torch's ``x + r`` and the norm
    ``rms_norm``'s of it, both bit for bit, whatever the layouts (a strided ``r``)."""
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(DEVICE, dtype)
    r = (torch.randn((*shape[:-1], 2 * shape[-1]), generator=g, dtype=torch.float64)).to(DEVICE, dtype)[..., ::2]
    w = (1 + torch.randn(shape[-1], generator=g, dtype=torch.float64) / 4).to(DEVICE, dtype)
    total, normed = add_rms_norm(x, r, w, 1e-5, impl)
    assert torch.equal(total, x + r) and torch.equal(normed, rms_norm(x + r, w, 1e-5, impl))
    alone, normed = add_rms_norm(x, None, w, 1e-5, impl)
    assert alone is x and torch.equal(normed, rms_norm(x, w, 1e-5, impl))


@pytest.mark.parametrize("impl", IMPLS)
def test_add_rms_norm_reads_rows_of_any_layout(impl):
    """``x`` and ``r`` as views whose rows are evenly strided (unit last stride, so read in place, not
    copied), of two different row strides each way round: the sum and the norm are the unfused ops'."""
    g = torch.Generator().manual_seed(2)
    a = torch.randn(4, 6, 32, dtype=torch.float64, generator=g).to(DEVICE)[:, ::2]  # (4, 3, 32), rows 64 apart
    b = torch.randn(4, 3, 48, dtype=torch.float64, generator=g).to(DEVICE)[..., 8:40]  # (4, 3, 32), rows 48 apart
    w = torch.linspace(0.5, 1.5, 32, dtype=torch.float64, device=DEVICE)
    for x, r in ((a, b), (b, a)):
        total, normed = add_rms_norm(x, r, w, 1e-6, impl)
        assert torch.equal(total, x + r) and torch.equal(normed, rms_norm(x + r, w, 1e-6, impl))


@pytest.mark.parametrize("impl", IMPLS)
def test_float16_norms_are_literal(impl):
    """Both impls round ``x / rms`` to float16 before the weight (the module docstring's formula): 1 / rms
    of the row [1, 2] is 1295.27 float16 ulps, rounded to 1295, times 3 a tie rounded to even, 1.896484375
    (one rounding of the product would give 1.8974609375); the row [300, -400] squares past float16's
    65504, so its sums run in float32 (in float16 they overflow and the row normalises to 0)."""
    x = torch.tensor([[1.0, 2.0], [300.0, -400.0]], dtype=torch.float16, device=DEVICE)
    w = torch.tensor([3.0, 1.0], dtype=torch.float16, device=DEVICE)
    want = [[1.896484375, 1.2646484375], [2.546875, -1.1318359375]]
    assert rms_norm(x, w, 1e-5, impl).tolist() == want
    assert add_rms_norm(x, torch.zeros_like(x), w, 1e-5, impl)[1].tolist() == want


def test_bad_additions_are_value_errors():
    x, w = torch.ones(2, 4, device=DEVICE), torch.ones(4, device=DEVICE)
    for r in (torch.ones(2, 5, device=DEVICE), x.double(), torch.ones(2, 4, device="meta")):
        with pytest.raises(ValueError, match="one shape, dtype and device"):
            add_rms_norm(x, r, w, 1e-5, "torch")
    with pytest.raises(ValueError, match="impl 'auto', 'torch' or 'triton'"):
        add_rms_norm(x, x, w, 1e-5, "bogus")
    if CUDA or INTERPRETED:
        with pytest.raises(ValueError, match="weight must be"):
            add_rms_norm(x, x, w[:3], 1e-5, "triton")
        with pytest.raises(ValueError, match="no backward"):
            add_rms_norm(x, x.clone().requires_grad_(), w, 1e-5, "triton")


def test_pending_additions_change_no_bit_of_a_model_pass():
    """The blocks' additions left pending (``Block.step``, ``TargetLM.final``) against the stack as
    written before: each block ``x + attn(norm(x))``, then ``x + mlp(norm(x))``, then the logits."""
    target, head = wmtp.build_models("tiny", seed=0)
    ids = torch.randint(0, target.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    pos, caches = torch.arange(9), (target.new_cache(2, 16), target.new_cache(2, 16))
    with torch.no_grad():
        x = torch.nn.functional.embedding(ids, target.embed)
        for i, blk in enumerate(target.layers):
            x = x + blk.attn(blk.attn_norm(x), pos, caches[0], i, *target.layer_key_set(i), "torch")
            x = x + blk.mlp(blk.mlp_norm(x))
        logits, hidden = target(ids, pos, caches[1], "torch")
        assert torch.equal(hidden, x) and torch.equal(logits, target.logits(x))
        assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
        e = torch.nn.functional.embedding(ids, target.embed)
        inp = torch.cat([head.hidden_norm(hidden), head.embed_norm(e)], dim=-1) @ head.proj.T
        g = head.block(inp, pos, head.new_cache(2, 16), 0, None, None, "torch")
        want_logits, got_g = target.logits(g), head(hidden, ids, pos, head.new_cache(2, 16), impl="torch")
        assert torch.equal(got_g[1], g) and torch.equal(got_g[0], want_logits)


@pytest.mark.parametrize("eps", [1e-5, 1e-6, 1e-12, 0.1, 1.0])
def test_eps_halves_are_float32_and_sum_to_eps(eps):
    """NOTE [eps]: Triton passes each half as float32; both are float32 numbers and add up to eps."""
    import numpy as np

    hi, lo = eps_halves(eps)
    assert float(np.float32(hi)) == hi and abs(float(np.float32(lo)) - lo) <= 1e-7 * abs(lo) and hi + lo == eps


def test_bad_impls_and_weights_are_value_errors():
    x = torch.ones(2, 4, dtype=torch.float64)
    w = torch.ones(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="impl 'auto', 'torch' or 'triton'"):
        rms_norm(x, w, 1e-5, "bogus")
    assert torch.equal(rms_norm(x, w, 1e-5, "auto"), rms_norm_torch(x, w, 1e-5))  # the reference off CUDA
    if not (CUDA or INTERPRETED):
        return
    x = x.to(DEVICE)
    # short, strided (made on the device: .to(cuda) of a strided tensor copies it dense), float32, on another
    # device (meta, and the CPU beside CUDA)
    f64 = dict(dtype=torch.float64, device=DEVICE)
    for bad in (torch.ones(3, **f64), torch.ones(8, **f64)[::2], torch.ones(4, device=DEVICE),
                torch.ones(4, dtype=torch.float64, device="meta"),
                torch.ones(4, dtype=torch.float64) if CUDA else None):
        if bad is None:
            continue
        with pytest.raises(ValueError, match="weight must be"):
            rms_norm(x, bad, 1e-5, "triton")
    empty = torch.ones(2, 0, **f64)  # rows of no entries: refused, not launched
    with pytest.raises(ValueError, match="rms_norm needs N >= 1 entries a row"):
        rms_norm(empty, torch.ones(0, **f64), 1e-5, "triton")
    with pytest.raises(ValueError, match="add_rms_norm needs N >= 1 entries a row"):
        add_rms_norm(empty, empty, torch.ones(0, **f64), 1e-5, "triton")
    w = w.to(DEVICE).requires_grad_()
    with pytest.raises(ValueError, match="no backward"):
        rms_norm(x, w, 1e-5, "triton")
    with torch.no_grad():
        assert rms_norm(x, w, 1e-5, "triton").shape == x.shape


def test_the_model_norms_in_triton_only_on_cuda():
    assert op_impl("torch", "cpu") == op_impl("auto", "cpu") == op_impl("triton", "cpu") == "torch"
    assert (op_impl("torch", "cuda"), op_impl("auto", "cuda"), op_impl("triton", "cuda")) == (
        "torch", "auto", "triton")
    with pytest.raises(ValueError, match="unknown impl"):
        op_impl("bogus", "cpu")


@pytest.mark.skipif(not CUDA, reason="needs CUDA: gradients through the model's norms")
def test_gradients_flow_through_the_norms_with_impl_auto_on_cuda():
    """With a gradient needed, 'auto' norms and rotates with the references (the kernels have no
    backward): the gradients equal impl='torch''s, every parameter's."""
    target, _ = (m.cuda().float() for m in wmtp.build_models("tiny", seed=0))
    ids = torch.arange(8, device="cuda")[None]
    grads = []
    for impl in ("auto", "torch"):
        target.zero_grad()
        target(ids, impl=impl)[0].sum().backward()
        grads.append([p.grad.clone() for p in target.parameters()])
    assert all(torch.allclose(a, b) for a, b in zip(*grads))


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the model's Triton norms")
@torch.no_grad()
def test_a_model_pass_on_cuda_norms_with_the_kernel(monkeypatch):
    """Every norm of a target pass and a head pass with Triton attention runs a kernel (2 a layer and
    the final one, each with the addition before it but the first; the head's 2 on its input as one
    kernel, wmtp/head_input.py; its block's 2 and the final one with their additions), none with
    impl='torch'."""
    from wmtp import block, model, mtp

    impls = []
    plain, plain_add = block.rms_norm, block.add_rms_norm
    monkeypatch.setattr(block, "rms_norm", lambda x, w, eps, impl: impls.append(("norm", impl)) or
                        plain(x, w, eps, impl))
    for module in (block, model):  # the blocks' norms, and TargetLM.final's (the target's and the head's)
        monkeypatch.setattr(module, "add_rms_norm", lambda x, r, w, eps, impl: impls.append(
            ("add" if r is not None else "first", impl)) or plain_add(x, r, w, eps, impl))
    plain_input = mtp.head_input
    monkeypatch.setattr(mtp, "head_input", lambda *a: impls.append(("input", a[-1])) or plain_input(*a))
    target, head = (m.cuda().float() for m in wmtp.build_models("tiny", seed=0))
    n = target.config.n_layers
    ids, pos = torch.arange(8, device="cuda")[None], torch.arange(8, device="cuda")
    logits, hidden = target(ids, pos, target.new_cache(1, 16), impl="triton")
    head(hidden, ids, pos, head.new_cache(1, 16), impl="triton")
    assert sorted(impls) == sorted([("first", "triton")] * 2 + [("add", "triton")] * (2 * n + 2) +
                                   [("input", "triton")])
    impls.clear()
    ref, _ = target(ids, pos, target.new_cache(1, 16), impl="torch")
    assert sorted(impls) == sorted([("first", "torch")] + [("add", "torch")] * (2 * n))
    assert (logits - ref).abs().max() <= 1e-3 * ref.abs().max()
