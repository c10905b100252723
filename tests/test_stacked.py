"""Stacked weights (wmtp/stacked.py): one product for a block's q/k/v and one for SwiGLU's gate/up.

On the CPU the model never stacks (``stacks`` needs CUDA), so these tests force it where they need it
and compare with the separate products; the CUDA tests run the model's own choice."""

import copy

import pytest
import torch

import wmtp
from wmtp import model
from wmtp.stacked import WeightStack, stacks

CUDA = torch.cuda.is_available()


def _force_stacking(monkeypatch):
    """Stack on any device when no weight needs a gradient (``stacks`` without its CUDA and impl
    conditions: off CUDA the small ops' impl is always ``"torch"``)."""
    monkeypatch.setattr(model, "stacks", lambda impl, x, ws: not (
        torch.is_grad_enabled() and any(w.requires_grad for w in ws)))


def _attention():
    target, _ = wmtp.build_models("tiny", seed=0)
    return target.double().layers[0].attn


def test_the_stack_is_the_weights_rows_in_order():
    attn = _attention()
    s = attn.qkv.get(attn)
    assert torch.equal(s, torch.cat([attn.wq, attn.wk, attn.wv])) and not s.requires_grad
    assert attn.qkv.sizes(attn) == [attn.wq.shape[0], attn.wk.shape[0], attn.wv.shape[0]]
    assert attn.qkv.get(attn) is s  # kept while nothing changed
    with pytest.raises(ValueError, match="at least one"):
        WeightStack()


def test_the_stack_is_built_again_when_a_weight_changes():
    """In place (an optimizer step, ``load_state_dict``), a new tensor (``param.data = ...``, ``.to``)."""
    attn = _attention()
    first = attn.qkv.get(attn)
    with torch.no_grad():
        attn.wk.add_(1.0)  # in place: the version counter
    second = attn.qkv.get(attn)
    assert second is not first and torch.equal(second, torch.cat([attn.wq, attn.wk, attn.wv]))
    state = {k: v + 2.0 for k, v in attn.state_dict().items()}
    attn.load_state_dict(state)
    assert torch.equal(attn.qkv.get(attn), torch.cat([state["wq"], state["wk"], state["wv"]]))
    attn.wv.data = torch.zeros_like(attn.wv)  # a new tensor of the same shape, dtype and device
    assert not attn.qkv.get(attn)[-attn.wv.shape[0]:].any()
    attn.float()
    assert attn.qkv.get(attn).dtype == torch.float32
    opt = torch.optim.SGD(attn.parameters(), lr=0.5)
    attn.wq.grad = torch.ones_like(attn.wq)
    opt.step()
    assert torch.equal(attn.qkv.get(attn), torch.cat([attn.wq, attn.wk, attn.wv]).detach())


def test_a_copy_stacks_its_own_weights():
    attn = _attention()
    attn.qkv.get(attn)
    twin = copy.deepcopy(attn)
    with torch.no_grad():
        twin.wq.mul_(3.0)
    assert torch.equal(twin.qkv.get(twin)[: twin.wq.shape[0]], twin.wq)
    assert torch.equal(attn.qkv.get(attn)[: attn.wq.shape[0]], attn.wq)


def test_stacks_needs_cuda_a_kernel_impl_and_no_gradient():
    w = torch.nn.Parameter(torch.ones(2, 2))
    assert not stacks("auto", torch.ones(2), [w])  # the CPU: its numbers never move
    if CUDA:
        x = torch.ones(2, device="cuda")
        wc = torch.nn.Parameter(torch.ones(2, 2, device="cuda"))
        assert not stacks("auto", x, [wc]) and not stacks("torch", x, [wc])
        with torch.no_grad():
            assert stacks("auto", x, [wc]) and stacks("triton", x, [wc]) and not stacks("torch", x, [wc])
        assert stacks("auto", x, [wc.detach()])


def test_stacked_products_are_the_separate_ones(monkeypatch):
    """A block's q/k/v and gate/up outputs, stacked (forced on the CPU) against one product each,
    float64: equal to rounding, of the same shapes."""
    attn = _attention()
    mlp = wmtp.build_models("tiny", seed=1)[0].double().layers[1].mlp
    x = torch.randn(2, 5, attn.cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        separate = model.project(attn, attn.qkv, x, "torch") + model.project(mlp, mlp.gate_up, x, "torch")
        _force_stacking(monkeypatch)
        stacked = model.project(attn, attn.qkv, x, "auto") + model.project(mlp, mlp.gate_up, x, "auto")
    assert len(stacked) == 5 and stacked[0].untyped_storage().data_ptr() == stacked[2].untyped_storage().data_ptr()
    for s, p in zip(stacked, separate, strict=True):
        assert s.shape == p.shape and torch.allclose(s, p, rtol=0, atol=1e-13)


def test_speculative_decoding_with_stacked_products_is_lossless(monkeypatch):
    """The model's stacked route (forced on the CPU), float64: speculative output equals the dense
    greedy output of the same route, token for token, and training still takes the separate products
    (a gradient reaches every weight)."""
    _force_stacking(monkeypatch)
    target, head = (m.double() for m in wmtp.build_models("tiny", seed=3))
    prompt = torch.randint(0, target.config.vocab_size, (24,), generator=torch.Generator().manual_seed(3))
    dense = wmtp.greedy_generate(target, prompt, 24)
    assert target.layers[0].attn.qkv._stack is not None and head.block.mlp.gate_up._stack is None
    for window in (None, 8):
        spec, _ = wmtp.speculative_generate(target, head, prompt, 24, 3, n_sink=2, window=window)
        assert torch.equal(spec, dense)
    assert head.block.mlp.gate_up._stack is not None
    logits, _ = target(prompt[None], impl="auto")
    logits.sum().backward()
    assert all(p.grad is not None for p in target.parameters())


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the model's own stacking")
@torch.no_grad()
def test_the_model_stacks_on_cuda(monkeypatch):
    """With Triton attention a block makes its q/k/v one product and its gate/up another: two products
    fewer a block (F.linear counted), the logits those of impl='torch' within float64 rounding."""
    import torch.nn.functional as F

    target, _ = (m.cuda().double() for m in wmtp.build_models("tiny", seed=0))
    ids, pos = torch.arange(8, device="cuda")[None], torch.arange(8, device="cuda")
    calls = []
    plain = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: calls.append(w.shape[0]) or plain(x, w, b))
    got, _ = target(ids, pos, target.new_cache(1, 16), impl="triton")
    n_stacked = len(calls)
    calls.clear()
    want, _ = target(ids, pos, target.new_cache(1, 16), impl="torch")
    assert len(calls) - n_stacked == 3 * target.config.n_layers
    assert torch.allclose(got, want, rtol=0, atol=1e-10)
