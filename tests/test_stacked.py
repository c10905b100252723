"""Stacked weights (wmtp/stacked.py): one product for a block's q/k/v and one for SwiGLU's gate/up,
over parameters kept as neighbouring rows of one tensor (NOTE [Stacked weights]).

On the CPU the model never stacks (``stacks`` needs CUDA), so these tests force it where they need it
and compare with the separate products; the CUDA tests run the model's own choice."""

import copy
import io

import pytest
import torch

import wmtp
from wmtp import linear as products
from wmtp.stacked import pack, stacked_view, stacks

CUDA = torch.cuda.is_available()


def _force_stacking(monkeypatch):
    """Stack on any device when no weight needs a gradient (``stacks`` without its CUDA and impl
    conditions: off CUDA the small ops' impl is always ``"torch"``)."""
    monkeypatch.setattr(products, "stacks", lambda impl, x, ws: not (
        torch.is_grad_enabled() and any(w.requires_grad for w in ws)))


def _attention():
    target, _ = wmtp.build_models("tiny", seed=0)
    return target.double().layers[0].attn


def _view(m):
    return stacked_view([getattr(m, n) for n in m.STACK])


def _cat(m):
    return torch.cat([getattr(m, n).detach() for n in m.STACK])


def test_the_stack_is_a_view_of_the_weights_rows_in_order():
    attn = _attention()
    s = _view(attn)
    assert torch.equal(s, _cat(attn)) and not s.requires_grad and attn.STACK == ("wq", "wk", "wv")
    assert s.untyped_storage().data_ptr() == attn.wq.untyped_storage().data_ptr()  # no copy
    assert [n for n, _ in attn.named_parameters()] == ["wq", "wk", "wv", "wo"]  # checkpoints as before
    assert stacked_view([attn.wq, attn.wv]) is None  # not neighbours
    assert stacked_view([attn.wq[:, :4], attn.wk[:, :4]]) is None  # rows not whole


def test_every_update_is_seen_and_conversions_pack_again():
    """In place, by any route (a fused optimizer, ``.data``, ``load_state_dict``, inference mode):
    the view reads the new values. A conversion packs again; what leaves the weights apart makes
    ``stacked_view`` return None (the products then run one per weight), never a stale stack."""
    attn = _attention()
    with torch.no_grad():
        attn.wk.add_(1.0)
    attn.wv.data.mul_(2.0)
    assert torch.equal(_view(attn), _cat(attn))
    opt = torch.optim.Adam(attn.parameters(), lr=0.5, fused=False, foreach=False)
    attn.wq.grad = torch.ones_like(attn.wq)
    opt.step()
    assert torch.equal(_view(attn), _cat(attn))
    state = {k: v + 2.0 for k, v in attn.state_dict().items()}
    with torch.inference_mode():
        attn.load_state_dict(state)
    assert torch.equal(_view(attn), torch.cat([state["wq"], state["wk"], state["wv"]]))
    attn.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)  # new tensors: packed again
    assert _view(attn) is not None and torch.equal(_view(attn), torch.cat([state["wq"], state["wk"], state["wv"]]))
    for convert in (lambda m: m.float(), lambda m: m.to(torch.float64), lambda m: m.to_empty(device="cpu")):
        convert(attn)
        assert _view(attn) is not None and _view(attn).dtype == attn.wq.dtype
    twin = copy.deepcopy(attn)  # each parameter cloned apart
    assert _view(twin) is None and torch.equal(_cat(twin), _cat(attn))
    twin.double()
    assert _view(twin) is not None
    side = attn.wv.data
    attn.wv.data = attn.wv.data.clone()
    assert _view(attn) is None
    pack(attn, attn.STACK)
    assert _view(attn) is not None and torch.equal(attn.wv, side)
    square = torch.nn.Module()
    square.a, square.b = (torch.nn.Parameter(torch.randn(3, 3, dtype=torch.float64)) for _ in range(2))
    pack(square, ("a", "b"))
    square.b.data = square.b.data.t()  # same address, another layout
    assert stacked_view([square.a, square.b]) is None


def test_a_whole_module_saves_and_loads_as_before():
    attn = _attention()
    f = io.BytesIO()
    torch.save(attn, f)
    f.seek(0)
    back = torch.load(f, weights_only=False)
    assert _view(back) is not None and torch.equal(_cat(back), _cat(attn))


def test_stacked_view_is_none_unless_the_weights_are_rows_of_one_tensor():
    """Rows laid out as ``pack`` leaves them, but in two tensors, or one tensor read as two dtypes, or
    1-D: ``None``, never a view over what is not the weights (mutation round 5: dropping the storage,
    the dtype or the 2-D check survived)."""
    a, b = torch.arange(12.0).view(4, 3), torch.arange(12.0).view(4, 3)
    assert torch.equal(stacked_view([a[:2], a[2:]]), a)
    assert stacked_view([a[:2], b[2:]]) is None  # offsets 0 and 6, strides (3, 1): another tensor's rows
    assert stacked_view([a[:2], a.view(torch.int32)[2:]]) is None  # the same bytes as int32
    assert stacked_view([torch.ones(4), torch.ones(4)]) is None


def test_packing_packed_weights_copies_nothing():
    """``pack`` of weights already packed is a no-op: the same tensor under them (mutation round 5:
    packing again, into a new tensor of the same values, survived)."""
    attn = _attention()
    before = attn.wq.untyped_storage().data_ptr()
    pack(attn, attn.STACK)
    assert attn.wq.untyped_storage().data_ptr() == before == attn.wv.untyped_storage().data_ptr()


def test_pack_leaves_mismatched_weights_apart():
    m = torch.nn.Module()
    m.a, m.b = torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.ones(2, 3, dtype=torch.float64))
    pack(m, ("a", "b"))
    assert stacked_view([m.a, m.b]) is None and m.a.dtype == torch.float32


def test_stacks_needs_cuda_a_kernel_impl_and_no_weight_gradient():
    w = torch.nn.Parameter(torch.ones(2, 2))
    assert not stacks("auto", torch.ones(2), [w])  # the CPU: its numbers never move
    with torch.no_grad():  # not even with no gradient to keep (mutation round 5: dropping is_cuda survived)
        assert not stacks("auto", torch.ones(2), [w]) and not stacks("triton", torch.ones(2), [w])
    if CUDA:
        x = torch.ones(2, device="cuda")
        wc = torch.nn.Parameter(torch.ones(2, 2, device="cuda"))
        assert not stacks("auto", x, [wc]) and not stacks("torch", x, [wc])
        with torch.no_grad():
            assert stacks("auto", x, [wc]) and stacks("triton", x, [wc]) and not stacks("torch", x, [wc])
        assert stacks("auto", x.requires_grad_(), [wc.detach()])


def test_stacked_products_are_the_separate_ones(monkeypatch):
    """A block's q/k/v and gate/up outputs, stacked (forced on the CPU) against one product each,
    float64: equal to rounding, of the same shapes, views of one tensor."""
    attn = _attention()
    mlp = wmtp.build_models("tiny", seed=1)[0].double().layers[1].mlp
    x = torch.randn(2, 5, attn.cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        separate = products.project(attn, x, "torch") + products.project(mlp, x, "torch")
        _force_stacking(monkeypatch)
        stacked = products.project(attn, x, "auto") + products.project(mlp, x, "auto")
    assert len(stacked) == 5 and stacked[0].untyped_storage().data_ptr() == stacked[2].untyped_storage().data_ptr()
    assert separate[0].untyped_storage().data_ptr() != separate[2].untyped_storage().data_ptr()
    for s, p in zip(stacked, separate, strict=True):
        assert s.shape == p.shape and torch.allclose(s, p, rtol=0, atol=1e-13)


def test_stacked_few_row_products_take_the_route(monkeypatch):
    """NOTE [Few-row products] in wmtp/linear.py: a stacked product of 10 rows goes through ``linear``
    as the separate ones do (on CUDA addmm, cuBLASLt), with a zero bias as long as the stacked outputs:
    one biased product for q/k/v (the tiny preset's 64 + 32 + 32), one for gate/up (128 + 128); the
    route and the stacking forced on the CPU."""
    import torch.nn.functional as F

    biased = []
    plain = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: biased.append(None if b is None else len(b)) or
                        plain(x, w, b))
    monkeypatch.setattr(products, "few_rows", lambda x, rows: 1 < rows <= products.FEW_ROWS)
    _force_stacking(monkeypatch)
    attn = _attention()
    mlp = wmtp.build_models("tiny", seed=1)[0].double().layers[1].mlp
    x = torch.randn(2, 5, attn.cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outs = products.project(attn, x, "auto") + products.project(mlp, x, "auto")
    assert biased == [64 + 32 + 32, 128 + 128] and [o.shape[-1] for o in outs] == [64, 32, 32, 128, 128]


def test_speculative_decoding_with_stacked_products_is_lossless(monkeypatch):
    """The model's stacked route (forced on the CPU), float64: speculative output equals the dense
    greedy output of the same route, token for token."""
    _force_stacking(monkeypatch)
    used = []
    plain = products.stacked_view
    monkeypatch.setattr(products, "stacked_view", lambda ws: used.append(len(ws)) or plain(ws))
    target, head = (m.double() for m in wmtp.build_models("tiny", seed=3))
    prompt = torch.randint(0, target.config.vocab_size, (24,), generator=torch.Generator().manual_seed(3))
    dense = wmtp.greedy_generate(target, prompt, 24)
    assert used and set(used) == {2, 3}
    for window in (None, 8):
        spec, _ = wmtp.speculative_generate(target, head, prompt, 24, 3, n_sink=2, window=window)
        assert torch.equal(spec, dense)


def test_gradients_through_frozen_stacked_weights_are_the_separate_ones(monkeypatch):
    """Frozen blocks, a trainable embedding: the stacked route runs (no weight of it needs a
    gradient), and the embedding's gradient is that of one product a weight, q/k rotations included."""
    target, _ = (m.double() for m in wmtp.build_models("tiny", seed=4))
    for block in target.layers:
        block.requires_grad_(False)
    ids = torch.arange(10)[None]
    grads = []
    for force in (False, True):
        if force:
            _force_stacking(monkeypatch)
        target.embed.grad = None
        logits, _ = target(ids, impl="auto")
        logits.square().sum().backward()
        grads.append(target.embed.grad.clone())
    assert torch.allclose(grads[0], grads[1], rtol=0, atol=1e-9 * grads[0].abs().max())


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
