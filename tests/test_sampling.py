"""Sampled decoding (wmtp/sampling.py): the position-keyed sampler follows its distribution, the
rejection rule emits the target's distribution, and the loops feed both rules the right rows.

Exact checks (``torch.equal``, float64): ``method="gumbel"`` equals dense sampling with the same
seed for every key set and depth; either method with a draft whose distribution is the target's
own equals it too (every draft accepted). Statistical checks use a fixed seed and 5-sigma bounds
of the binomial counts, so they are deterministic: a wrong rule fails them by far more.
"""

import pytest
import torch
from decode_harness import random_prompt

import wmtp
from wmtp import sampling
from wmtp.grading import harness_models
from wmtp.sampling import position_uniforms, sample_generate, sample_positions, speculative_sample, verify_rejection

CUDA = torch.cuda.is_available()
KEYSETS = [(0, None), (4, 16), (0, 1)]


@pytest.fixture(scope="module")
def models():
    return harness_models()


class MirrorDraft:
    """A draft whose logits are the target's own times ``scale`` (``scale=1``: ``q = p`` exactly):
    it runs the target, in a cache of its own, on the token each call hands it."""

    def __init__(self, target, prompt, scale=1.0):
        self.target, self.first, self.scale, self.cache = target, prompt[:1], scale, None

    def new_cache(self, batch, max_len, checked=True):
        self.cache = self.target.new_cache(batch, max_len, checked=checked)
        self.target(self.first.view(1, 1), torch.zeros(1, dtype=torch.long, device=self.first.device), self.cache,
                    "torch")  # position 0, which no head call hands over
        return self.cache

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        logits, h = self.target(next_ids, pos + 1, self.cache, impl)  # next_ids sit at pos + 1
        return logits * self.scale, h

    def write_cache(self, hidden, next_ids, pos, cache, impl):
        self(hidden, next_ids, pos, cache, None, None, impl)


def random_probs(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """``(rows, vocab)`` float64 distributions, uniform on the simplex (normalised exponentials)."""
    e = -torch.rand(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).log()
    return e / e.sum(-1, keepdim=True)


def within_5_sigma(counts: torch.Tensor, probs: torch.Tensor) -> None:
    n = counts.sum()
    sigma = (probs * (1 - probs) / n).sqrt()
    assert ((counts / n - probs).abs() <= 5 * sigma + 1e-12).all(), (counts / n, probs)


def test_noise_is_a_function_of_seed_stream_and_position():
    rows = position_uniforms(7, 0, [3, 900, 5], 16)  # (3, 16)
    assert rows.dtype == torch.float64 and ((rows >= 0) & (rows < 1)).all()
    assert torch.equal(rows[1], position_uniforms(7, 0, [900], 16)[0])  # batching does not matter
    for other in (position_uniforms(8, 0, [900], 16), position_uniforms(7, 1, [900], 16),
                  position_uniforms(7, 0, [901], 16)):
        assert not torch.equal(other[0], rows[1])
    # seed, stream and position each weigh in on their own: swapping two of them is another row
    for a, b in (((900, 0, 7), (7, 0, 900)), ((1, 2, 5), (2, 1, 5)), ((3, 1, 2), (3, 2, 1))):
        assert not torch.equal(position_uniforms(a[0], a[1], [a[2]], 16), position_uniforms(b[0], b[1], [b[2]], 16))


def test_noise_stays_on_the_cpu_whatever_the_default_device():
    """The float64 noise is drawn on the CPU by name: under ``torch.set_default_device("mps")`` an
    unnamed draw would land on MPS, which has no float64 (and rejects a CPU generator). "meta"
    stands in for MPS here; the sampled token still lands on the probabilities' device."""
    expected = position_uniforms(7, 0, [3, 900], 16)
    with torch.device("meta"):
        rows = position_uniforms(7, 0, [3, 900], 16)
        token = sample_positions(torch.full((1, 16), 1 / 16, device="cpu"), [3], seed=7)
    assert rows.device.type == "cpu" and torch.equal(rows, expected)
    assert token.device.type == "cpu"


def test_sampled_tokens_follow_the_distribution():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0], dtype=torch.float64)
    n = 20000
    tokens = sample_positions(probs.expand(n, -1), range(n), seed=1)
    within_5_sigma(torch.bincount(tokens, minlength=5).double(), probs)
    assert torch.equal(tokens, sample_positions(3 * probs.expand(n, -1), range(n), seed=1))  # weights suffice
    assert not torch.equal(tokens, sample_positions(probs.expand(n, -1), range(n), seed=2))


def test_rejection_rule_emits_the_target_distribution():
    """Fixed ``p`` (3 rows) and ``q`` (2 rows) far apart; 20000 verifications at fresh positions.
    The first token out is distributed as ``p[0]``, the second (after an accepted draft) as ``p[1]``,
    and draft 0 is accepted with probability ``sum min(p[0], q[0])``."""
    p, q = random_probs(3, 5, seed=0), random_probs(2, 5, seed=1)  # (K+1, V), (K, V)
    first, second, accepted = torch.zeros(5), torch.zeros(5), 0
    trials = 20000
    for trial in range(trials):
        pos = 3 * trial  # positions pos, pos + 1, pos + 2: never shared between trials
        drafts = sample_positions(q, [pos, pos + 1], seed=11)  # as the rule's propose draws them
        a, x = verify_rejection(drafts, q, p, pos, seed=11)
        out = drafts[:a].tolist() + [int(x)]
        first[out[0]] += 1
        if a >= 1:
            accepted += 1
            second[out[1]] += 1
    within_5_sigma(first.double(), p[0])
    within_5_sigma(second.double(), p[1])
    beta = torch.minimum(p[0], q[0]).sum()
    assert abs(accepted / trials - beta) <= 5 * (beta * (1 - beta) / trials).sqrt()


def test_a_draft_the_target_rules_out_is_rejected_even_at_u_zero(monkeypatch):
    """Acceptance is ``u * q(d) < p(d)`` with ``u`` in ``[0, 1)``: strict, so a draft with ``p(d) = 0`` is
    never committed, not even at ``u = 0`` (``<=`` would commit it there), and one with ``p(d) > 0`` is
    accepted at ``u = 0``. The accept uniforms are forced to 0; the resample keeps its own noise."""
    real = sampling.position_uniforms

    def zero_accept(seed, stream, positions, n):
        u = real(seed, stream, positions, n)
        return torch.zeros_like(u) if stream == sampling.ACCEPT else u

    monkeypatch.setattr(sampling, "position_uniforms", zero_accept)
    q = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)  # (K=1, V=3): the draft is sure of token 1
    p = torch.tensor([[0.5, 0.0, 0.5], [0.2, 0.3, 0.5]], dtype=torch.float64)  # (K+1, V): the target rules 1 out
    for pos in range(16):
        a, x = verify_rejection(torch.tensor([1]), q, p, pos, seed=3)
        assert (a, int(x) in (0, 2)) == (0, True), pos  # rejected; resampled from max(p - q, 0) = [.5, 0, .5]
    p[0] = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert verify_rejection(torch.tensor([1]), q, p, 0, seed=3)[0] == 1


def test_a_rejection_where_p_is_q_up_to_rounding_resamples_from_p(monkeypatch):
    """``p(2)`` is one ulp below ``q(2)`` and ``p == q`` elsewhere, so ``max(p - q, 0)`` is all zeros: a
    rejection (forced: ``u = 1 - 2**-53``, and ``u * q(2) = 0.5 - 2**-54 > p(2)``) resamples from ``p``
    itself, every token possible, not from the empty residual (whose argmax would be token 0 always)."""
    real = sampling.position_uniforms

    def top_accept(seed, stream, positions, n):
        u = real(seed, stream, positions, n)
        return torch.full_like(u, 1 - 2**-53) if stream == sampling.ACCEPT else u

    monkeypatch.setattr(sampling, "position_uniforms", top_accept)
    q = torch.tensor([[0.25, 0.25, 0.5]], dtype=torch.float64)  # (K=1, V=3)
    p = torch.tensor([[0.25, 0.25, 0.5 - 2**-53], [0.2, 0.3, 0.5]], dtype=torch.float64)  # (K+1, V)
    out = [verify_rejection(torch.tensor([2]), q, p, pos, seed=5) for pos in range(32)]
    assert all(a == 0 for a, _ in out)  # every draft rejected
    assert sorted({int(x) for _, x in out}) == [0, 1, 2]


@pytest.mark.parametrize("k, q_rows, p_rows", [(0, 0, 1), (2, 1, 3), (2, 2, 2), (2, 2, 4)])
def test_rejection_rule_refuses_mismatched_shapes(k, q_rows, p_rows):
    with pytest.raises(ValueError, match="verify_rejection needs"):
        verify_rejection(torch.zeros(k, dtype=torch.long), random_probs(q_rows, 5, 0), random_probs(p_rows, 5, 1), 0, 0)


P3, Q2, D2 = random_probs(3, 5, 0), random_probs(2, 5, 1), torch.tensor([1, 2])  # (K+1, V), (K, V), (K,)


@pytest.mark.parametrize("args, match", [  # IndexError, TypeError, AttributeError or a silent answer before
    ((torch.tensor(1), Q2[:1], P3[:2], 0, 0), "drafts \\(K,\\) with K >= 1"),  # 0-d drafts: IndexError
    ((D2, Q2, torch.tensor(1.0), 0, 0), "drafts \\(K,\\) with K >= 1"),  # 0-d target_probs: IndexError
    (([1, 2], Q2, P3, 0, 0), "drafts must be a torch.Tensor, got list"),
    ((D2.float(), Q2, P3, 0, 0), "integer drafts and floating-point probabilities"),
    ((D2, (Q2 * 100).long(), P3, 0, 0), "floating-point probabilities"),
    ((torch.tensor([-1, 2]), Q2, P3, 0, 0), r"drafts\[0\] = -1 is not a token id in \[0, 5\)"),  # read p[-1]
    ((torch.tensor([5, 2]), Q2, P3, 0, 0), r"drafts\[0\] = 5"),  # IndexError
    ((D2, -Q2, P3, 0, 0), "probabilities must be >= 0"), ((D2, Q2 * float("nan"), P3, 0, 0), "nan"),
    ((D2, Q2, -P3, 0, 0), r"probabilities must be >= 0 and finite, got target -"),  # rejected, then sampled
    ((D2, Q2.to("meta"), P3, 0, 0), "one device"),
    ((D2, Q2, P3, -1, 0), r"pos \(the first draft's position\) must be >= 0"), ((D2, Q2, P3, 1.5, 0), "got 1.5"),
    ((D2, Q2, P3, 0, -1), r"seed must be an int in \[0, 2\*\*64\)"), ((D2, Q2, P3, 0, 1.5), "seed"),
    ((D2, Q2, P3, 0, None), "seed"),
    ((D2, P3[:2], P3 * torch.tensor([[1.0], [1.0], [0.0]]), 0, 0), r"target_probs\[2\] has no positive"),  # token 0
    ((D2, Q2, P3 * torch.tensor([[0.0], [1.0], [1.0]]), 0, 0), r"target_probs\[0\] has no positive"),  # rejected
    ((D2, Q2, P3 * float("inf"), 0, 0), "probabilities must be >= 0 and finite, got target inf"),  # (2, token 0)
    ((D2, Q2 * float("inf"), P3, 0, 0), "finite, got target .* and draft inf"),
    ((D2, P3[:2], P3 * torch.tensor([[1.0], [1.0], [float("inf")]]), 0, 0), r"target_probs\[2\] holds an infinite"),
])
def test_rejection_rule_refuses_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        verify_rejection(*args)


def test_the_smallest_temperature_samples(models):
    """At MIN_TEMPERATURE sampling is all but greedy, and nothing overflows."""
    target, _ = models
    prompt = random_prompt(6)
    out = sample_generate(target, prompt, 8, sampling.MIN_TEMPERATURE, seed=1)
    assert torch.equal(out, wmtp.greedy_generate(target, prompt, 8))


def test_rejection_rule_accepts_a_draft_with_the_targets_distribution():
    p = random_probs(4, 7, seed=2)
    for pos in range(0, 300, 4):
        drafts = sample_positions(p[:3], range(pos, pos + 3), seed=5)
        a, x = verify_rejection(drafts, p[:3], p, pos, seed=5)
        assert a == 3 and x == sample_positions(p[3:], [pos + 3], seed=5)[0]


@pytest.mark.parametrize("temperature", [0.6, 1.0, 2.5])
@pytest.mark.parametrize("depth", [1, 3, 8])
@pytest.mark.parametrize("n_sink,window", KEYSETS)
def test_gumbel_method_equals_dense_sampling(models, temperature, depth, n_sink, window):
    """The random head (drafts almost never right), a flattened mirror (some right) and the exact
    mirror (all right): the output equals ``sample_generate`` with the same seed, token for token."""
    target, head = models
    prompt = random_prompt(10, seed=depth)
    ref = sample_generate(target, prompt, 30, temperature, seed=depth)
    for name, draft in [("head", head), ("mirror/2", MirrorDraft(target, prompt, 0.5)),
                        ("mirror", MirrorDraft(target, prompt))]:
        out, stats = speculative_sample(target, draft, prompt, 30, depth, n_sink, window, temperature=temperature,
                                        seed=depth, method="gumbel")
        assert torch.equal(out, ref), name
        if name == "mirror":
            assert stats.accepted == stats.proposed  # the same noise on the same distribution: always right


@pytest.mark.parametrize("depth", [1, 4])
@pytest.mark.parametrize("n_sink,window", KEYSETS)
def test_rejection_with_the_targets_distribution_equals_dense_sampling(models, depth, n_sink, window):
    """A draft with ``q = p`` is never rejected and samples each token with the dense run's noise."""
    target, _ = models
    prompt = random_prompt(9, seed=depth)
    ref = sample_generate(target, prompt, 25, 1.0, seed=4)
    out, stats = speculative_sample(target, MirrorDraft(target, prompt), prompt, 25, depth, n_sink, window,
                                    temperature=1.0, seed=4)
    assert torch.equal(out, ref)
    assert stats.accepted == stats.proposed  # every draft accepted (the last step's may be cut)


def test_rejection_sees_the_targets_and_drafts_own_distributions(models, monkeypatch):
    """Every verification gets, as ``p``, the dense target's next-token distributions over the
    committed prefix and the drafts; each draft is the sample of its ``q`` at its position; and
    the committed tokens are what the rule returned."""
    target, _ = models
    prompt, T = random_prompt(8, seed=3), 0.8
    calls = []

    def recording(drafts, q, p, pos, seed):
        result = verify_rejection(drafts, q, p, pos, seed)
        calls.append((drafts.clone(), q.clone(), p.clone(), pos, result))
        return result

    monkeypatch.setattr(sampling, "verify_rejection", recording)
    out, stats = speculative_sample(target, MirrorDraft(target, prompt, 0.4), prompt, 40, 3, 4, 16,
                                    temperature=T, seed=9)
    assert len(calls) == stats.steps and 0 < stats.accepted < stats.proposed  # some rejections, some accepts
    seq = torch.cat([prompt, out])
    for drafts, q, p, pos, (a, x) in calls:
        n = pos - 1  # the step's first token sits at position n
        ids = torch.cat([seq[: n + 1], drafts])
        logits, _ = target(ids[None], torch.arange(ids.numel()), target.new_cache(1, ids.numel()), "torch")
        dense = torch.softmax(logits[0, n:] / T, -1)  # (K+1, V): the distributions of positions n+1 .. n+K+1
        torch.testing.assert_close(p, dense, rtol=0, atol=1e-12)
        assert torch.equal(drafts, sample_positions(q, range(pos, pos + 3), seed=9))
        assert torch.equal(seq[pos: pos + a + 1], torch.cat([drafts[:a], x.view(1)])[: len(seq) - pos])


def test_temperature_zero_is_greedy(models):
    target, head = models
    prompt = random_prompt(11)
    ref = wmtp.greedy_generate(target, prompt, 20)
    assert torch.equal(sample_generate(target, prompt, 20, 0), ref)
    for method in sampling.METHODS:
        out, stats = speculative_sample(target, head, prompt, 20, 3, 4, 16, temperature=0.0, method=method)
        greedy_out, greedy_stats = wmtp.speculative_generate(target, head, prompt, 20, 3, 4, 16)
        assert torch.equal(out, ref) and stats.accept_length_histogram == greedy_stats.accept_length_histogram


def test_batches_and_prefills_run_as_alone(models):
    target, head = models
    prompts = [random_prompt(n, seed=n) for n in (1, 6, 13)]
    dense = sample_generate(target, prompts, 12, 1.3, seed=2)
    outs, stats = speculative_sample(target, head, prompts, 12, 2, 4, 16, temperature=1.3, seed=2, method="gumbel")
    for p, d, o in zip(prompts, dense, outs):
        assert torch.equal(d, sample_generate(target, p, 12, 1.3, seed=2)) and torch.equal(o, d)
    prompt = prompts[2]
    pre = wmtp.prefill_prompt(target, prompt, 40, draft=head)
    assert torch.equal(sample_generate(target, prompt, 12, 1.3, seed=2, prefill=pre), dense[2])
    for method in sampling.METHODS:
        alone = speculative_sample(target, head, prompt, 12, 2, temperature=1.3, seed=2, method=method)
        shared = speculative_sample(target, head, prompt, 12, 2, temperature=1.3, seed=2, method=method, prefill=pre)
        assert torch.equal(alone[0], shared[0]) and alone[1].accepted == shared[1].accepted


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.5}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": 1e-5}, "temperature"), ({"temperature": 1e-300}, "temperature"),
    ({"temperature": True}, "temperature"), ({"temperature": "1"}, "temperature"),
    ({"seed": -1}, "seed"), ({"seed": 2 ** 64}, "seed"), ({"seed": 1.0}, "seed"), ({"seed": True}, "seed"),
    ({"method": "nucleus"}, "method"), ({"depth": 0}, "depth"), ({"max_new_tokens": -1}, "max_new_tokens"),
])
def test_bad_arguments_raise_value_error(models, kwargs, match):
    target, head = models
    args = {"max_new_tokens": 5, "depth": 2, "temperature": 1.0, "seed": 0, "method": "rejection"} | kwargs
    with pytest.raises(ValueError, match=match):
        speculative_sample(target, head, random_prompt(4), args.pop("max_new_tokens"), args.pop("depth"), **args)
    if "method" not in kwargs and "depth" not in kwargs:
        dense = {k: args[k] for k in ("temperature", "seed")}
        with pytest.raises(ValueError, match=match):
            sample_generate(target, random_prompt(4), kwargs.get("max_new_tokens", 5), **dense)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("method", sampling.METHODS)
def test_cuda_sampling_matches_the_cpu(models, impl, method):
    """Float64 on CUDA, the backend's own attention: the gumbel method equals the device's dense
    sampling; both methods equal the CPU runs with the same seed (the noise is drawn on the CPU)."""
    import copy

    target, head = (m.to("cuda") for m in copy.deepcopy(models))
    prompt = random_prompt(12, seed=5)
    ref = sample_generate(target, prompt.cuda(), 30, 0.9, seed=6, impl=impl)
    assert torch.equal(ref.cpu(), sample_generate(models[0], prompt, 30, 0.9, seed=6))
    for n_sink, window in KEYSETS:
        out, _ = speculative_sample(target, head, prompt.cuda(), 30, 3, n_sink, window, temperature=0.9, seed=6,
                                    method=method, impl=impl)
        cpu, _ = speculative_sample(*models, prompt, 30, 3, n_sink, window, temperature=0.9, seed=6, method=method)
        assert out.device.type == "cuda" and torch.equal(out.cpu(), cpu)
        if method == "gumbel":
            assert torch.equal(out, ref)
