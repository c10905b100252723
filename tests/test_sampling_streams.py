"""What each sampled choice of wmtp/sampling.py is keyed by and what a run passes on (mutation round 6):
rejection draws its accept uniforms at the drafts' own positions and its next token at that token's
position, from the stream of its case; the draft samples at the run's temperature; and a list of
prompts runs each prompt with every option of the single-prompt call (impl and gate too, in the greedy
generators as well)."""

import pytest
import torch
from decode_harness import random_prompt
from test_sampling import MirrorDraft

from wmtp import decode, sampling
from wmtp.decode import greedy_generate, speculative_generate
from wmtp.grading import harness_models
from wmtp.sampling import check_sampling, sample_generate, speculative_sample, verify_rejection


@pytest.fixture(scope="module")
def models():
    return harness_models()


def test_rejection_draws_each_choice_at_its_own_position(monkeypatch):
    """Drafts at positions 10 and 11. Draft 0 (token 1, ``p(1) = q(1)``) is accepted whatever its
    uniform, draft 1 (token 1, ``p(1) = 0``) rejected whatever its: the uniforms are asked for at
    ``[10, 11]`` (``ACCEPT``), the resample at ``[11]`` (``RESIDUAL``). With every draft certain, the
    next token is drawn at ``[12]`` from the token stream (``pos + 1 ..`` for the uniforms survived)."""
    asked = []
    real = sampling.position_uniforms

    def recording(seed, stream, positions, n):
        asked.append((stream, list(positions)))
        return real(seed, stream, positions, n)

    monkeypatch.setattr(sampling, "position_uniforms", recording)
    q = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)  # (K=2, V=3)
    p = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5], [0.2, 0.3, 0.5]], dtype=torch.float64)  # (K+1, V)
    a, x = verify_rejection(torch.tensor([1, 1]), q, p, 10, seed=3)
    assert (a, int(x) in (0, 2)) == (1, True)
    assert asked == [(sampling.ACCEPT, [10, 11]), (sampling.RESIDUAL, [11])]
    asked.clear()
    p[1] = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    a, x = verify_rejection(torch.tensor([1, 1]), q, p, 10, seed=3)
    assert a == 2 and asked == [(sampling.ACCEPT, [10, 11]), (sampling.TOKEN, [12])]


def test_rejection_drafts_at_the_runs_temperature(models):
    """A draft with the target's logits at temperature 0.5: ``q = softmax(logits / 0.5) = p``, so no
    draft is rejected and the output is dense sampling's (a draft sampling ``softmax(logits)`` at
    temperature 1 stays lossless in distribution, and survived the temperature 1 tests)."""
    target, _ = models
    prompt = random_prompt(9, seed=5)
    out, stats = speculative_sample(target, MirrorDraft(target, prompt), prompt, 10, 3, 4, 16, temperature=0.5, seed=6)
    assert torch.equal(out, sample_generate(target, prompt, 10, 0.5, seed=6))
    assert stats.accepted == stats.proposed > 0


@pytest.mark.parametrize("temperature", [float("inf"), float("-inf")])
def test_an_infinite_temperature_is_refused(temperature):
    with pytest.raises(ValueError, match="temperature must be 0 \\(greedy\\) or a finite number"):
        check_sampling(temperature, 0)


def test_a_list_of_prompts_takes_every_option(models, monkeypatch):
    """A list of one prompt with ``eos_id`` (a token its run alone commits 4th), ``draft_cache="ring"``
    and ``positions="reindexed"``: the output is the run alone, cut after that token, with the ring's
    draft KV, and every head call is told ``positions="reindexed"``; dense sampling of a list takes
    ``eos_id`` too (dropping ``eos_id``, ``draft_cache`` or ``positions`` for a list survived)."""
    target, head = models
    prompt = random_prompt(14, seed=1)
    options = dict(temperature=0.9, seed=2, draft_cache="ring", positions="reindexed")
    alone, alone_stats = speculative_sample(target, head, prompt, 8, 3, 2, 6, **options)  # (8,)
    eos = int(alone[3])
    told, forward = [], head.forward
    monkeypatch.setattr(head, "forward", lambda *a, **kw: told.append(kw.get("positions")) or forward(*a, **kw))
    outs, stats = speculative_sample(target, head, [prompt], 8, 3, 2, 6, eos_id=eos, **options)
    monkeypatch.undo()
    assert len(told) >= 3 and set(told) == {"reindexed"}
    assert torch.equal(outs[0], alone[: alone.tolist().index(eos) + 1])  # at most 4 tokens
    assert stats[0].draft_kv_bytes == alone_stats.draft_kv_bytes
    dense_alone = sample_generate(target, prompt, 8, 0.9, seed=2)
    dense_eos = int(dense_alone[3])
    dense = sample_generate(target, [prompt], 8, 0.9, seed=2, eos_id=dense_eos)
    assert torch.equal(dense[0], dense_alone[: dense_alone.tolist().index(dense_eos) + 1])


def test_a_list_of_prompts_passes_impl_and_gate_to_each_run(models, monkeypatch):
    """Each prompt of a list reaches the decode loop with the call's ``impl`` and ``gate``, in all four
    generators (a session 54 audit: dropping ``impl`` for a list in the sampling ones survived, so a
    list ran whatever ``"auto"`` picked where one prompt was refused or held to the asked impl)."""
    target, head = models
    prompts = [random_prompt(9, seed=1), random_prompt(11, seed=2)]
    seen = []
    for module in (decode, sampling):
        dense, spec = module.dense_loop, module.speculative_loop
        # dense_loop(target, prompt, max_new, eos_id, impl, ...); speculative_loop(..., window, impl, ..., gate)
        monkeypatch.setattr(module, "dense_loop", lambda *a, dense=dense: seen.append(("dense", a[4])) or dense(*a))
        monkeypatch.setattr(module, "speculative_loop",
                            lambda *a, spec=spec: seen.append(("spec", a[7], a[-1])) or spec(*a))
    greedy_generate(target, prompts, 3, impl="torch")
    speculative_generate(target, head, prompts, 3, 2, 2, 6, "torch", gate=10)
    sample_generate(target, prompts, 3, 0.9, seed=2, impl="torch")
    for method in ("rejection", "gumbel"):
        speculative_sample(target, head, prompts, 3, 2, 2, 6, temperature=0.9, method=method, impl="torch", gate=10)
    assert seen == [("dense", "torch")] * 2 + [("spec", "torch", 10)] * 2 + [("dense", "torch")] * 2 \
        + [("spec", "torch", 10)] * 4
