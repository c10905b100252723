"""The MTP head's input row (wmtp/head_input.py): one parametrized test over both impls against the
unfused ops, bit for bit; ids out of range; bad input; the head's use of it.

The Triton cases run on CUDA, or on CPU tensors under Triton's interpreter (no bf16 there)."""

import pytest
import torch
import torch.nn.functional as F
from op_impls import CUDA, DEVICE, IMPLS, INTERPRETED

import wmtp
from wmtp.head_input import head_input, head_input_torch
from wmtp.rmsnorm import rms_norm

DTYPES = [torch.float32, torch.float64, torch.float16] + ([torch.bfloat16] if CUDA else [])


def _case(shape, dtype, V=50, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    N = shape[-1]
    hidden = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(DEVICE, dtype)
    ids = torch.randint(0, V, shape[:-1], generator=g).to(DEVICE)
    embed = torch.randn(V, N, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    wh, we = ((1 + torch.randn(N, generator=g, dtype=torch.float64) / 4).to(DEVICE, dtype) for _ in range(2))
    return hidden, ids, embed, wh, we


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 16), (1, 8, 64), (2, 3, 100), (5, 256), (3, 1)])
def test_head_input_is_the_unfused_ops(impl, dtype, shape):
    """Each half is ``rms_norm`` of the same impl on its input, bit for bit; ``"torch"`` is the code
    the head ran before (an embedding lookup, two norms, a concatenation)."""
    hidden, ids, embed, wh, we = _case(shape, dtype)
    got = head_input(hidden, ids, embed, wh, we, 1e-5, 1e-6, impl)
    want = torch.cat([rms_norm(hidden, wh, 1e-5, impl), rms_norm(F.embedding(ids, embed), we, 1e-6, impl)], -1)
    assert got.shape == (*shape[:-1], 2 * shape[-1]) and got.dtype == dtype and got.device == hidden.device
    assert torch.equal(got, want)
    if impl == "torch":
        assert torch.equal(got, head_input_torch(hidden, ids, embed, wh, we, 1e-5, 1e-6))


@pytest.mark.parametrize("impl", IMPLS)
def test_head_input_reads_any_layout_and_int32_ids(impl):
    hidden, ids, embed, wh, we = _case((4, 6, 32), torch.float64)
    view = hidden.transpose(0, 1)[:, ::2]  # (6, 2, 32): strided, no view flattens it
    sub = ids.T[:, ::2].int()
    want = head_input_torch(view, sub, embed, wh, we, 1e-5, 1e-5)
    assert torch.allclose(head_input(view, sub, embed, wh, we, 1e-5, 1e-5, impl), want, rtol=0, atol=1e-12)
    assert head_input(hidden[:0], ids[:0], embed, wh, we, 1e-5, 1e-5, impl).shape == (0, 6, 64)


@pytest.mark.skipif(not (CUDA or INTERPRETED), reason="needs CUDA or TRITON_INTERPRET=1")
def test_an_id_out_of_range_gives_a_nan_row():
    """The gather is masked to [0, V) (an interpreter run cannot see a stray read; V = 0 is refused)."""
    hidden, ids, embed, wh, we = _case((1, 4, 16), torch.float32, V=10)
    bad = ids.clone()
    bad[0, 1], bad[0, 3] = 10, -1
    got = head_input(hidden, bad, embed, wh, we, 1e-5, 1e-5, "triton")
    ok = head_input(hidden, ids, embed, wh, we, 1e-5, 1e-5, "triton")
    assert got[0, [1, 3], 16:].isnan().all() and torch.equal(got[0, [0, 2]], ok[0, [0, 2]])
    assert torch.equal(got[..., :16], ok[..., :16])


def test_an_id_out_of_range_on_the_cpu_reference_is_a_value_error():
    """The reference's lookup raises IndexError on the CPU; head_input (and MTPHead.forward) say which ids."""
    hidden, ids, embed, wh, we = _case((1, 4, 16), torch.float32, V=10)
    hidden, ids, embed, wh, we = (t.cpu() for t in (hidden, ids, embed, wh, we))
    for v in (10, -11):
        bad = ids.clone()
        bad[0, 2] = v
        with pytest.raises(ValueError, match=r"ids must lie in \[0, 10\)"):
            head_input(hidden, bad, embed, wh, we, 1e-5, 1e-5, "torch")
    target, head = wmtp.build_models("tiny", seed=0)
    with pytest.raises(ValueError, match=rf"ids must lie in \[0, {target.config.vocab_size}\)"):
        head(torch.zeros(1, 3, target.config.d_model), torch.tensor([[1, target.config.vocab_size, 2]]))


def test_bad_input_is_a_value_error():
    hidden, ids, embed, wh, we = _case((2, 3, 8), torch.float32)
    cases = [((hidden, ids, embed, wh, we), "bogus", "impl"),
             ((hidden.long(), ids, embed, wh, we), "torch", "floating hidden"),
             ((hidden, ids, embed[:, :4], wh, we), "torch", "embed \\(V, N\\)"),
             ((hidden, ids, embed[:0], wh, we), "torch", "V >= 1"),
             ((hidden, ids[:, :2], embed, wh, we), "torch", "ids must be"),
             ((hidden, ids.float(), embed, wh, we), "torch", "ids must be"),
             ((hidden, ids, embed.double(), wh, we), "torch", "embed must be"),
             ((hidden, ids, embed, wh[:4], we), "torch", "w_hidden must be"),
             ((hidden, ids, embed, wh, we.to("meta")), "torch", "w_embed must be on")]
    for args, impl, match in cases:
        with pytest.raises(ValueError, match=match):
            head_input(*args, 1e-5, 1e-5, impl)
    if CUDA or INTERPRETED:
        with pytest.raises(ValueError, match="no backward"):
            head_input(hidden.clone().requires_grad_(), ids, embed, wh, we, 1e-5, 1e-5, "triton")
    grads = head_input(hidden.clone().requires_grad_(), ids, embed, wh, we, 1e-5, 1e-5, "auto")  # the reference
    grads.sum().backward()


def test_the_head_takes_its_input_from_head_input(monkeypatch):
    """The head's forward passes its norms' weights and eps and the shared embedding, with the small
    ops' impl; off CUDA its logits are those of the code before, bit for bit."""
    from wmtp import mtp

    target, head = (m.double() for m in wmtp.build_models("tiny", seed=0))
    hidden = torch.randn(1, 6, target.config.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ids = torch.arange(6)[None]
    seen = []
    plain = mtp.head_input
    monkeypatch.setattr(mtp, "head_input", lambda *a: seen.append(a) or plain(*a))
    with torch.no_grad():
        logits, g = head(hidden, ids, impl="auto")
        e = F.embedding(ids, target.embed)
        x = torch.cat([head.hidden_norm(hidden), head.embed_norm(e)], dim=-1)
    (h, i, emb, wh, we, eh, ee, impl), = seen
    assert h is hidden and i is ids and emb is target.embed and wh is head.hidden_norm.weight
    assert we is head.embed_norm.weight and (eh, ee) == (head.hidden_norm.eps, head.embed_norm.eps)
    assert impl == "torch" and torch.equal(plain(*seen[0]), x)  # op_impl off CUDA


@pytest.mark.parametrize("impl", IMPLS)
def test_head_input_reads_rows_of_any_stride(impl):
    """Rows of a slice are a view whose row stride is not N (rows_of keeps it): the kernel must step
    by the stride it is given (mutation round 7, part d: the stride taken as N survived)."""
    hidden, ids, embed, wh, we = _case((2, 3, 16), torch.float64)
    wide = torch.cat([hidden, -hidden], -1)  # (2, 3, 32)
    view = wide[..., :16]
    assert view.reshape(-1, 16).stride(0) == 32
    got = head_input(view, ids, embed, wh, we, 1e-5, 1e-6, impl)
    assert torch.equal(got, head_input(hidden, ids, embed, wh, we, 1e-5, 1e-6, impl))


def test_bad_weights_and_empty_rows_are_value_errors():
    """Each weight's layout, dtype and gradient is checked, not only the first's, and a row of no
    features is refused (mutation round 7, part d: the stride check dropped, only embed's dtype
    checked, the weights' gradients not looked at for ``"triton"``, and N = 0 let through survived)."""
    hidden, ids, embed, wh, we = (t.cpu() for t in _case((2, 3, 8), torch.float32))
    strided = torch.stack([wh, wh], 1)[:, 0]  # (8,), stride 2
    contiguous = r"w_hidden must be \(8,\) and contiguous; got \(8,\) of stride \(2,\)"
    cases = [((hidden, ids, embed, strided, we), contiguous),
             ((hidden, ids, embed, wh, strided), "w_embed must be .* contiguous"),
             ((hidden, ids, embed, wh.double(), we), "w_hidden must be on cpu in torch.float32"),
             ((hidden, ids, embed, wh, we.half()), "w_embed must be on cpu in torch.float32"),
             ((hidden[..., :0], ids, embed[:, :0], wh[:0], we[:0]), "N >= 1"),
             ((hidden[0, 0, 0], ids[0, 0], embed, wh, we), "N >= 1")]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            head_input(*args, 1e-5, 1e-5, "torch")
    if CUDA or INTERPRETED:
        for i in (2, 3, 4):  # embed, w_hidden, w_embed
            args = [t.to(DEVICE) for t in (hidden, ids, embed, wh, we)]
            args[i] = args[i].clone().requires_grad_()
            with pytest.raises(ValueError, match="no backward"):
                head_input(*args, 1e-5, 1e-5, "triton")
