# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Sampled verification
#
# ## What you will learn
#
# Notebook 03 verified greedily: the target's next token is its argmax, a fixed function of the prefix,
# and a draft is accepted iff it equals that token. With temperature `T > 0` the target's next token is a
# *sample* of `p = softmax(logits / T)`, so there is no single token to compare with. Draw one sample of
# `p` and compare the draft's `d ~ q` with it, and the output is still the target's (every committed token
# is one of its samples), but the two independent draws agree only with probability `sum_x p(x) q(x)`:
# rarely when `p` is spread out, even for a perfect draft (`q = p` gives `sum_x p(x)^2`). And "lossless"
# changes meaning: the output of a sampled run is random, so speculation must give the *same
# distribution* as dense sampling, not the same tokens.
#
# `wmtp.speculative_sample` verifies sampled drafts in one of two ways (`wmtp/sampling.py`):
#
# - `method="rejection"` (speculative sampling, Leviathan et al. 2023, Chen et al. 2023): accept `d` with
#   probability `min(1, p(d) / q(d))`, and after a rejection sample the *residual* `max(p - q, 0)`,
#   normalised. Each token comes out distributed as `p` exactly, and a draft is accepted with probability
#   `sum_x min(p(x), q(x))`, the most any verifier of one draft can get;
# - `method="gumbel"`: draft and target sample with the *same* noise (the Gumbel-max trick, noise keyed by
#   the token's position), and verification is notebook 03's greedy rule on those samples. The output
#   equals dense sampling with the same seed token for token, so `torch.equal` tests it again; it accepts
#   less than rejection sampling.
#
# You will compute the rejection rule's output distribution exactly on a five-token example, run
# `wmtp.verify_rejection` a few thousand times against it, see why position-keyed noise makes a sampled
# run a function of its seed, check that the gumbel method reproduces `wmtp.sample_generate`, and measure
# both methods' acceptance for drafts from perfect to poor.

# %%
import inspect
from fractions import Fraction

import matplotlib.pyplot as plt
import torch

import wmtp
from wmtp import grading
from wmtp.sampling import GumbelRule, position_uniforms, sample_positions

# %% [markdown]
# ## Naive reference
#
# One position, a five-token vocabulary, a target distribution `p` and a draft distribution `q` written
# by hand (the draft likes tokens 1 and 2 more than the target does). The rejection rule emits `x` in two
# ways: the draft proposes `x` (probability `q(x)`) and it is accepted (probability `min(1, p(x)/q(x))`),
# or the draft is rejected (probability `1 - beta`, with `beta = sum_x min(p(x), q(x))`) and the residual
# picks `x`. In exact arithmetic, with fractions:

# %%
p = [Fraction(45, 100), Fraction(25, 100), Fraction(15, 100), Fraction(10, 100), Fraction(5, 100)]
q = [Fraction(10, 100), Fraction(40, 100), Fraction(30, 100), Fraction(5, 100), Fraction(15, 100)]
beta = sum(min(px, qx) for px, qx in zip(p, q))  # acceptance of one draft
residual = [max(px - qx, 0) for px, qx in zip(p, q)]  # where the target wants more than the draft gives
emitted = [qx * min(1, px / qx) + (1 - beta) * rx / sum(residual) for px, qx, rx in zip(p, q, residual)]

print(f"{'x':>2} {'p':>5} {'q':>5} {'accepted q min(1, p/q)':>23} {'from the residual':>18} {'emitted':>8}")
for x in range(5):
    acc = q[x] * min(1, p[x] / q[x])
    print(f"{x:>2} {float(p[x]):>5.2f} {float(q[x]):>5.2f} {float(acc):>23.2f} {float(emitted[x] - acc):>18.2f} "
          f"{float(emitted[x]):>8.2f}")
assert emitted == p  # exactly: Fraction arithmetic
print(f"\nbeta = sum min(p, q) = {float(beta):.4f}   (independent samples would agree with "
      f"probability sum p q = {float(sum(px * qx for px, qx in zip(p, q))):.4f})")

# %% [markdown]
# The rejection probability `1 - beta = 0.40` equals the residual's own mass, `sum max(p - q, 0)`, so
# the residual term of a token is `max(p - q, 0)` itself: what acceptance under-delivers on tokens 0
# and 3 (where `p > q`), the residual adds back, and nothing else. Tokens 1, 2 and 4, which the draft
# over-proposes, are trimmed to `p` by the acceptance test alone.

# %% [markdown]
# ## Mechanism
#
# `wmtp.verify_rejection` is that rule, draft by draft, for a step of `K` drafts: the first rejection
# ends the step with a residual sample; `K` acceptances end it with a sample of the target's last row.

# %%
print(inspect.getsource(wmtp.verify_rejection))

# %% [markdown]
# Its random numbers come from `position_uniforms(seed, stream, positions, n)`: row `i` is drawn from a
# fresh `torch.Generator` seeded by a hash of `(seed, stream, positions[i])`, in float64 on the CPU. The
# noise of a position is therefore a function of the seed and the position alone: not of how many
# positions one call asks for, in what order, on which device, or how the steps of a run batched them.

# %%
rows = position_uniforms(seed=7, stream=0, positions=[3, 900, 5], n=4)
alone = position_uniforms(seed=7, stream=0, positions=[900], n=4)
print(rows)
assert torch.equal(rows[1], alone[0])  # position 900's noise, asked for among others or alone
print("position 900's row is the same asked alone:", torch.equal(rows[1], alone[0]))

# %% [markdown]
# **The Gumbel-max trick.** With `G` a row of independent Gumbel noise (`-log(-log u)`, `u` uniform),
# `argmax(log p + G)` is a sample of `p`. `wmtp.sampling.sample_positions` samples every token that way,
# from the position-keyed uniforms: the token at position `t` is `argmax(log p_t + G(seed, t))`. So the
# sampled token is a deterministic function of `(p_t, seed, t)`, and two runs that see the same
# distribution at `t` choose the same token. That is what the gumbel method exploits: the draft proposes
# `argmax(log q_t + G(seed, t))` with the *same* noise the target will use, and verification is the
# greedy comparison of notebook 03 on the perturbed argmaxes:

# %%
print(inspect.getsource(GumbelRule))

# %% [markdown]
# On the five-token example: 20000 positions, the target's and the draft's samples drawn with the same
# noise (the gumbel coupling) and with unrelated noise (another seed).

# %%
p_t, q_t = torch.tensor([float(x) for x in p], dtype=torch.float64), torch.tensor([float(x) for x in q],
                                                                                 dtype=torch.float64)
n = 20000
target_tokens = sample_positions(p_t.expand(n, -1), range(n), seed=1)
coupled = sample_positions(q_t.expand(n, -1), range(n), seed=1)  # the same noise
independent = sample_positions(q_t.expand(n, -1), range(n), seed=2)  # other noise
print("target's sample frequencies", [round(c / n, 3) for c in torch.bincount(target_tokens, minlength=5).tolist()],
      "vs p", p_t.tolist())
print(f"draft == target: coupled {float((coupled == target_tokens).double().mean()):.3f}, "
      f"independent {float((independent == target_tokens).double().mean()):.3f}; "
      f"beta = {float(beta):.3f}, sum p q = {float(p_t @ q_t):.3f}")

# %% [markdown]
# Sharing the noise lifts agreement far above independent sampling, but not to `beta`: the two argmaxes
# agree on *some* coupling of `p` and `q`, and no coupling agrees more often than `sum min(p, q)` (the
# coupling inequality). Rejection sampling attains that bound; the Gumbel coupling does not in general.

# %% [markdown]
# ## Check
#
# **The rejection rule emits `p`.** 4000 one-draft verifications of the example, each at positions of
# its own (`pos = 2 i`: the draft at `pos`, the token after an acceptance at `pos + 1`), so each gets
# fresh noise. The first token out is the accepted draft or the rule's sample. Both the token frequencies
# and the acceptance are binomial counts: they must lie within 5 standard deviations of `p` and `beta`.

# %%
trials, seed = 4000, 11
q_rows, p_rows = q_t[None], p_t.expand(2, -1)  # (K, V) and (K + 1, V) with K = 1
counts, accepted = torch.zeros(5, dtype=torch.float64), 0
for i in range(trials):
    pos = 2 * i
    drafts = sample_positions(q_rows, [pos], seed)  # the draft's sample of q at pos
    a, x = wmtp.verify_rejection(drafts, q_rows, p_rows, pos, seed)
    counts[int(drafts[0]) if a == 1 else int(x)] += 1
    accepted += a

freq, sigma = counts / trials, (p_t * (1 - p_t) / trials).sqrt()
print(f"{'x':>2} {'p':>6} {'emitted':>8} {'(p - emitted) / sigma':>22}")
for x in range(5):
    print(f"{x:>2} {float(p_t[x]):>6.3f} {float(freq[x]):>8.3f} {float((p_t[x] - freq[x]) / sigma[x]):>22.2f}")
b = float(beta)
print(f"acceptance {accepted / trials:.3f} vs beta {b:.3f}")
assert ((freq - p_t).abs() <= 5 * sigma).all()
assert abs(accepted / trials - b) <= 5 * (b * (1 - b) / trials) ** 0.5

# %% [markdown]
# **The gumbel method equals dense sampling, token for token.** The models are
# `wmtp.grading.harness_models()`: the tiny float64 target with wide random weights (vocabulary 512) and
# a random MTP head, whose drafts are almost never right. For a draft that is sometimes right we let the
# target draft for itself: `MirrorDraft` runs the target, in a cache of its own, and returns its logits
# times a scale `s`, so its `q` is `softmax(s * logits / T)`: `s = 1` gives `q = p` exactly, smaller `s`
# flattens `q` (the same class as in `tests/test_sampling.py`).

# %%
class MirrorDraft:
    """A draft whose logits are the target's own times ``scale`` (``scale=1``: ``q = p`` exactly)."""

    def __init__(self, target, prompt, scale=1.0):
        self.target, self.first, self.scale, self.cache = target, prompt[:1], scale, None

    def new_cache(self, batch, max_len, checked=True):
        self.cache = self.target.new_cache(batch, max_len, checked=checked)
        self.target(self.first.view(1, 1), torch.zeros(1, dtype=torch.long, device=self.first.device), self.cache,
                    "torch")  # position 0, which no head call hands over
        return self.cache

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        logits, h = self.target(next_ids, pos + 1, self.cache, impl)  # next_ids sit at position pos + 1
        return logits * self.scale, h

    def write_cache(self, hidden, next_ids, pos, cache, impl):  # the prefill: fill the cache, no drafts
        self(hidden, next_ids, pos, cache, None, None, impl)


target, head = grading.harness_models()
V, K, N, T = target.config.vocab_size, 3, 40, 1.0
prompt = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(0))
dense = wmtp.sample_generate(target, prompt, N, T, seed=3)

print(f"{'key set':>12} {'draft':>10} {'acceptance':>10}  output == sample_generate")
for n_sink, window in [(0, None), (4, 16)]:
    for name, draft in [("head", head), ("mirror/2", MirrorDraft(target, prompt, 0.5)),
                        ("mirror", MirrorDraft(target, prompt))]:
        out, stats = wmtp.speculative_sample(target, draft, prompt, N, K, n_sink, window, temperature=T, seed=3,
                                             method="gumbel")
        assert torch.equal(out, dense), (n_sink, window, name)
        print(f"{str((n_sink, window)):>12} {name:>10} {stats.acceptance_rate:>10.2f}  {torch.equal(out, dense)}")

# %% [markdown]
# Any key set, any draft: the same 40 tokens. The random head's `(0, None)` and `(4, 16)` drafts differ,
# so their acceptance may differ; the output cannot.
#
# Rejection sampling gives no such guarantee: it commits the draft's own sample when it accepts, so its
# tokens are *another* sample of the same distribution. Only with `q = p` (every draft accepted, each
# drawn with the dense run's noise for its position) does it reproduce the dense tokens too:

# %%
exact, stats = wmtp.speculative_sample(target, MirrorDraft(target, prompt), prompt, N, K, temperature=T, seed=3)
assert torch.equal(exact, dense) and stats.acceptance_rate == 1.0
half, _ = wmtp.speculative_sample(target, MirrorDraft(target, prompt, 0.5), prompt, N, K, temperature=T, seed=3)
print("rejection, q = p:        output == sample_generate:", torch.equal(exact, dense))
print("rejection, mirror/2:     tokens equal to the dense run's:", int((half == dense).sum()), "of", N)

# %% [markdown]
# And temperature 0 is greedy decoding, whatever the method (no noise is drawn):

# %%
greedy = wmtp.greedy_generate(target, prompt, N)
for method in ("rejection", "gumbel"):
    out, _ = wmtp.speculative_sample(target, head, prompt, N, K, 4, 16, temperature=0.0, method=method)
    assert torch.equal(out, greedy)
print("temperature 0: both methods == greedy_generate")

# %% [markdown]
# ## Measure
#
# Acceptance of both methods as the draft gets worse: `MirrorDraft` at scales `s = 1, 0.75, 0.5, 0.25`,
# depth 3, temperature 1, 40 tokens from each of 4 prompts and seeds. Two rates:
#
# - `acceptance_rate` of `SpecStats`: accepted drafts over proposed drafts. It counts the drafts after a
#   step's first rejection as failures, though nobody looked at them;
# - *per verified draft*: accepted drafts over drafts the verifier actually judged (the accepted ones,
#   plus one rejection per step that did not accept all `K`). This is the rate theory predicts:
#   `beta = sum min(p, q)` per draft for rejection, and for gumbel the chance that the two perturbed
#   argmaxes agree, which we estimate with 200 noise draws a position.
#
# The theory is averaged over the positions of the dense samples (the gumbel method's output).

# %%
scales, seeds, draws = (1.0, 0.75, 0.5, 0.25), range(4), 200


def per_verified(stats) -> float:
    verified = stats.accepted + stats.steps - stats.accept_length_histogram[K]
    return stats.accepted / max(verified, 1)


runs = []  # (prompt, seed, the dense sample, the target's logits at its positions)
for s_ in seeds:
    pr = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(100 + s_))
    ref = wmtp.sample_generate(target, pr, N, T, seed=s_)
    ids = torch.cat([pr, ref])
    with torch.no_grad():
        logits, _ = target(ids[None], torch.arange(ids.numel()), target.new_cache(1, ids.numel()), "torch")
    runs.append((pr, s_, ref, logits[0, len(pr) - 1: -1]))  # (N, V): the logits each new token was drawn from

table = {}
for s in scales:
    row = {}
    for method in ("rejection", "gumbel"):
        agg = wmtp.SpecStats(depth=K)
        for pr, s_, ref, _ in runs:
            out, stats = wmtp.speculative_sample(target, MirrorDraft(target, pr, s), pr, N, K, temperature=T,
                                                 seed=s_, method=method)
            if method == "gumbel":
                assert torch.equal(out, ref), s  # at every scale
            agg.proposed += stats.proposed
            agg.accepted += stats.accepted
            agg.steps += stats.steps
            agg.accept_length_histogram[K] += stats.accept_length_histogram[K]
        row[method] = (agg.acceptance_rate, per_verified(agg))
    beta_t, coupled_t = [], []
    g = torch.Generator().manual_seed(0)
    for *_, lg in runs:
        pp, qq = torch.softmax(lg / T, -1), torch.softmax(s * lg / T, -1)  # (N, V)
        beta_t.append(torch.minimum(pp, qq).sum(-1))
        gumbel = -torch.log(-torch.log(torch.rand(draws, *lg.shape, generator=g, dtype=torch.float64)))
        coupled_t.append(((pp.log() + gumbel).argmax(-1) == (qq.log() + gumbel).argmax(-1)).double().mean(0))
    row["beta"], row["coupled"] = float(torch.cat(beta_t).mean()), float(torch.cat(coupled_t).mean())
    table[s] = row

print(f"{'s':>5} | {'acceptance_rate':^19} | {'per verified draft':^19} | {'theory per draft':^19}")
print(f"{'':>5} | {'rejection':>9} {'gumbel':>9} | {'rejection':>9} {'gumbel':>9} | {'beta':>9} {'coupled':>9}")
for s, row in table.items():
    print(f"{s:>5} | {row['rejection'][0]:>9.3f} {row['gumbel'][0]:>9.3f} | {row['rejection'][1]:>9.3f} "
          f"{row['gumbel'][1]:>9.3f} | {row['beta']:>9.3f} {row['coupled']:>9.3f}")
assert table[1.0]["rejection"][0] == table[1.0]["gumbel"][0] == 1.0  # q = p: every draft accepted

fig, ax = plt.subplots(figsize=(6, 4))
for method, theory, color in [("rejection", "beta", "C0"), ("gumbel", "coupled", "C1")]:
    ax.plot(scales, [table[s][method][1] for s in scales], "o-", color=color, label=f"{method}, measured")
    ax.plot(scales, [table[s][theory] for s in scales], "--", color=color, label=f"{method}, theory ({theory})")
ax.set_xlabel("draft scale s (q = softmax(s · logits))")
ax.set_ylabel("acceptance per verified draft")
ax.legend()
fig.tight_layout()

# %% [markdown]
# At `s = 1` both methods accept everything. As `q` flattens, both fall, the gumbel method below
# rejection sampling in theory at every scale; with only about 120 to 160 verified drafts per point, the
# measured rates scatter around their theory lines by up to several hundredths, so a measured point may cross the
# other method's. In every gumbel run the output was the dense sample, token for token.

# %% [markdown]
# ## Discussion
#
# - **Rejection sampling is distribution-exact and accepts the most.** Each committed token is
#   distributed as the target's, whatever the draft; a draft is accepted with probability
#   `sum min(p, q)`, the bound of the coupling inequality. Its output is a different sample than dense
#   sampling's, so it is tested statistically (`tests/test_sampling.py`, with 5-sigma bounds).
# - **The gumbel method is token-exact.** Draft and target share the noise of each position, so the
#   output *is* dense sampling's with the same seed: reproducible on any device and batching, and testable
#   with `torch.equal` exactly as greedy speculation. It pays in acceptance, since its coupling of `p` and
#   `q` is not the best one.
# - **The window changes `q` only.** A windowed draft reads fewer keys and may guess worse: that moves
#   `q`, hence `beta` and the acceptance. Neither rule looks at how `q` was computed, so the output
#   distribution (and under gumbel, the tokens) cannot move.
# - **Temperature 0 is greedy.** `speculative_sample(..., temperature=0)` is `speculative_generate`'s greedy
#   verification, and no noise is drawn.
#
# Try: rerun the sweep at `T = 0.5` and `T = 2.0`, or with the trained head of notebook 02 in place of
# `MirrorDraft` and several `(n_sink, window)`: the acceptance moves, the gumbel output does not.
