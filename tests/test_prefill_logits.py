"""NOTE [Logits at] (wmtp/model.py): ``TargetLM.forward(..., logits_at=)`` computes the LM head only at
the given positions; its logits are the full pass's rows up to a derived rounding bound, its hidden
states and caches the full pass's bit for bit, and every loop's prefill takes only the last
position's."""

import pytest
import torch
from op_impls import DEVICE, IMPLS

import wmtp
from wmtp.rows import prefill_rows


@pytest.fixture(scope="module")
def models():
    target, head = wmtp.build_models("tiny", seed=0)
    return target.to(DEVICE).float(), head.to(DEVICE).float()


def ids_of(B: int, L: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (B, L), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def rounding_bound(target, hidden: torch.Tensor) -> torch.Tensor:
    """Two summation orders of the head's dots of length d differ by at most 2 gamma_d sum |a_i b_i|
    (gamma_d = d u / (1 - d u), Higham, Accuracy and Stability, Sec. 3.1): ``(B, L, V)``."""
    u = torch.finfo(hidden.dtype).eps / 2
    d = hidden.shape[-1]
    normed = target.norm(hidden, "torch").abs()  # (B, L, d)
    return 2 * (d * u / (1 - d * u)) * (normed @ target.embed.abs().T) + 1e-30


@pytest.mark.parametrize("impl", IMPLS)
@torch.no_grad()
def test_logits_at_are_the_full_pass_rows(models, impl):
    """Each row its own positions, one twice, into a cache: hidden states and caches equal the full
    pass's, the logits its rows within the rounding bound."""
    target, _ = models
    B, L = 2, 12
    ids = ids_of(B, L)
    at = torch.tensor([[11, 0], [5, 5]], device=DEVICE)  # (B, n)
    full_cache, cache = target.new_cache(B, 16), target.new_cache(B, 16)
    full, full_hidden = target(ids, torch.arange(L, device=DEVICE), full_cache, impl)  # (B, L, V), (B, L, d)
    logits, hidden = target(ids, torch.arange(L, device=DEVICE), cache, impl, at)  # (B, 2, V), (B, L, d)
    assert logits.shape == (B, 2, target.config.vocab_size)
    assert torch.equal(hidden, full_hidden)
    assert torch.equal(cache.k, full_cache.k) and torch.equal(cache.v, full_cache.v)
    rows = full.gather(1, at[:, :, None].expand(-1, -1, full.shape[-1]))  # (B, 2, V)
    bound = rounding_bound(target, full_hidden).gather(1, at[:, :, None].expand(-1, -1, full.shape[-1]))
    assert ((logits - rows).abs() <= bound).all(), float(((logits - rows).abs() / bound).max())


@pytest.mark.parametrize("at,match", [
    (torch.tensor([3]), r"\(2, n\)"),
    (torch.tensor([[3], [4], [5]]), r"\(2, n\)"),
    (torch.tensor([[3.0], [4.0]]), "int32 or int64"),
    ([[3], [4]], "got list"),
    (torch.tensor([[3], [8]]), r"into the 8 positions of ids, got values 3\.\.8"),
    (torch.tensor([[-1], [0]]), "into the 8 positions"),
])
def test_a_bad_logits_at_is_refused(at, match):
    """On the CPU, where the range is checked too."""
    target, _ = wmtp.build_models("tiny", seed=0)
    with pytest.raises(ValueError, match=match):
        target(ids_of(2, 8).cpu(), logits_at=at)


@torch.no_grad()
def test_every_prefill_takes_only_the_last_logits(models, monkeypatch):
    """The LM head's row counts through each loop's prefill (one prompt, a padded batch, a lockstep
    batch): the target's one row a prompt, none for the MTP head (``write_cache``: NOTE [Shared draft
    prefill]), and the first new token is the full pass's at the last position."""
    target, head = models
    seen = []
    lm_head = type(target).lm_head

    def record(self, normed):
        seen.append(normed.shape[1])
        return lm_head(self, normed)

    monkeypatch.setattr(type(target), "lm_head", record)
    prompt = ids_of(1, 20, seed=1)[0]
    pre = wmtp.prefill_prompt(target, prompt, 32, draft=head)
    full, _ = target(prompt[None])  # (1, 20, V)
    assert seen == [1, 20] and torch.equal(pre.logits.argmax(), full[0, -1].argmax())
    seen.clear()
    rows = [prompt, prompt[:7]]
    _, _, x, _, _ = prefill_rows(target, head, rows, 32, "torch")
    assert seen == [1] and x.tolist() == [int(full[0, 19].argmax()), int(full[0, 6].argmax())]
    seen.clear()
    wmtp.lockstep_generate(target, head, ids_of(3, 9, seed=2), 1, 2, 0, None)
    assert seen == [1], seen  # one new token: no step
