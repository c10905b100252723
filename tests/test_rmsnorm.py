"""RMSNorm (wmtp/rmsnorm.py): the Triton kernel against the reference, one parametrized test over
both impls; the model's choice of impl (``norm_impl``).

Tolerance, as for attention (tests/attention_truth.py): an impl's error against the float64
reference may be at most twice the reference's own error in the same dtype, plus a floor of a
few units of the dtype's rounding. The Triton cases run on CUDA, or on CPU tensors under Triton's
interpreter (float32 and float64 only: the interpreter has no bf16).
"""

import os

import pytest
import torch

import wmtp
from wmtp.model import norm_impl
from wmtp.rmsnorm import rms_norm, rms_norm_torch

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if CUDA else "cpu"
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not (CUDA or INTERPRETED),
                                                                  reason="needs CUDA or TRITON_INTERPRET=1"))]
DTYPES = [torch.float32, torch.float64] + ([torch.bfloat16, torch.float16] if CUDA else [])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 16), (1, 3, 100), (2, 8, 256), (5, 64)])
def test_rms_norm_matches_the_reference(impl, dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(DEVICE, dtype)
    w = (1 + torch.randn(shape[-1], generator=g, dtype=torch.float64) / 4).to(DEVICE, dtype)
    truth = rms_norm_torch(x.double(), w.double(), 1e-5)
    got = rms_norm(x, w, 1e-5, impl)
    assert got.shape == x.shape and got.dtype == dtype and got.device == x.device
    ref_err = (rms_norm_torch(x, w, 1e-5).double() - truth).abs().max()
    floor = 4 * torch.finfo(dtype).eps * truth.abs().max()
    assert (got.double() - truth).abs().max() <= 2 * ref_err + floor


@pytest.mark.parametrize("impl", IMPLS)
def test_rms_norm_reads_rows_of_any_stride(impl):
    """A strided input (a view whose rows are not adjacent) is normalised row by row."""
    x = torch.randn(4, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    view = x[:, ::2]  # (4, 3, 32), rows 2 apart
    w = torch.linspace(0.5, 1.5, 32, dtype=torch.float64, device=DEVICE)
    assert torch.allclose(rms_norm(view, w, 1e-6, impl), rms_norm_torch(view, w, 1e-6), rtol=0, atol=1e-12)


def test_an_unresolved_impl_is_refused():
    x = torch.ones(2, 4)
    with pytest.raises(ValueError, match="impl 'torch' or 'triton'"):
        rms_norm(x, torch.ones(4), 1e-5, "auto")


def test_the_model_norms_in_triton_only_beside_triton_attention_on_cuda():
    assert norm_impl("torch", "cpu") == norm_impl("auto", "cpu") == norm_impl("triton", "cpu") == "torch"
    assert norm_impl("torch", "cuda") == "torch"
    if CUDA:
        assert norm_impl("triton", "cuda") == norm_impl("auto", "cuda") == "triton"


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the model's Triton norms")
@torch.no_grad()
def test_a_model_pass_on_cuda_norms_with_the_kernel(monkeypatch):
    """Every norm of a target pass and a head pass with Triton attention runs the kernel (2 a layer
    and the final one; the head's 2, its block's 2 and the final one), none with impl='torch'."""
    from wmtp import model

    impls = []
    plain = model.rms_norm
    monkeypatch.setattr(model, "rms_norm", lambda x, w, eps, impl: impls.append(impl) or plain(x, w, eps, impl))
    target, head = (m.cuda().float() for m in wmtp.build_models("tiny", seed=0))
    ids, pos = torch.arange(8, device="cuda")[None], torch.arange(8, device="cuda")
    logits, hidden = target(ids, pos, target.new_cache(1, 16), impl="triton")
    head(hidden, ids, pos, head.new_cache(1, 16), impl="triton")
    assert impls == ["triton"] * (2 * target.config.n_layers + 1 + 5)
    impls.clear()
    ref, _ = target(ids, pos, target.new_cache(1, 16), impl="torch")
    assert impls == ["torch"] * (2 * target.config.n_layers + 1)
    assert (logits - ref).abs().max() <= 1e-3 * ref.abs().max()
