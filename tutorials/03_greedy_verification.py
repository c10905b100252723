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
# # 03 · Greedy verification and losslessness
#
# ## What you will learn
#
# One speculative step, with `n` tokens committed and `x` the target's latest token:
#
# 1. the draft proposes `K` tokens `d_1 .. d_K`;
# 2. the target runs *one* forward pass over `[x, d_1 .. d_K]` and takes its greedy choice after each
#    prefix, `y_0 .. y_K`;
# 3. `d_i` is accepted while `d_i == y_{i-1}`; with `a` accepted, the step commits `d_1 .. d_a` and then
#    `y_a`, the target's own next token. So a step yields `a + 1` tokens (the *accept length* plus one;
#    the paper's mean accept length `AL`, `SpecStats.mean_accept_length`, averages the `a + 1`).
#
# You will see the verification rule written token by token and batched, check that the two agree, run
# the *oracle-draft experiment* (a draft right for exactly `j` tokens per step, `j = 0..K`), and see why
# acceptance can drop as far as you like while the output cannot change by a single token. Last, the same
# loop with steps that never read the device: the form a GPU can capture in a CUDA graph.

# %%
import inspect
import random

import matplotlib.pyplot as plt
import torch

import wmtp
from wmtp import grading
from wmtp.decode import verify_greedy, verify_greedy_loop

# %% [markdown]
# ## Naive reference
#
# Walk the drafts in order and stop at the first one the target would not have chosen. This is
# `wmtp.verify_greedy_loop`:

# %%
print(inspect.getsource(verify_greedy_loop))

# %% [markdown]
# A worked step with `K = 4`: the target agrees with the first two drafts and not the third. The fourth
# draft happens to equal `y_3`, but it does not count: `y_3` is what the target would say *after a prefix
# containing the wrong `d_3`*, a prefix that is never committed.

# %%
drafts = torch.tensor([5, 7, 9, 2])   # d_1 .. d_4
choice = torch.tensor([5, 7, 3, 2, 8])  # y_0 .. y_4: the target's argmax after x, x d_1, ..., x d_1..d_4
a = verify_greedy_loop(drafts, choice)
print(f"accepted {a}; the step commits {drafts[:a].tolist()} + [{int(choice[a])}]")

# %% [markdown]
# ## Mechanism
#
# The batched form, `wmtp.verify_greedy`, has no loop: compare all drafts at once, and keep the matches up
# to the first mismatch with a cumulative product (Medusa's `evaluate_posterior` does the same). It is an
# explicit argmax comparison, not sampling at temperature 0.

# %%
print(inspect.getsource(verify_greedy))
matches = (drafts == choice[: len(drafts)]).long()
print("matches  ", matches.tolist())
print("cumprod  ", matches.cumprod(0).tolist(), "-> accepted", int(matches.cumprod(0).sum()))

# %% [markdown]
# ## Check
#
# **Loop and batched agree.** Random cases over a 3-token vocabulary (so that matches, and matches after
# a mismatch, are common), depths 1 to 8.

# %%
rng = random.Random(0)
for _ in range(2000):
    k = rng.randrange(1, 9)
    y = torch.tensor([rng.randrange(3) for _ in range(k + 1)])
    d = torch.tensor([int(c) if rng.random() < 0.7 else rng.randrange(3) for c in y[:k]])
    assert verify_greedy(d, y) == verify_greedy_loop(d, y), (d, y)
print("verify_greedy == verify_greedy_loop on 2000 random cases")

# %% [markdown]
# **The oracle-draft experiment.** `wmtp.grading.OracleDraft` has the MTP head's call signature (and
# its `new_cache` and `write_cache`, the prefill's cache write, which it hands to the real head) but
# cheats: it knows the dense greedy output and proposes it for the first `j` drafts of every step, then
# a wrong token. It makes every accept length `0..K` happen on purpose. The target is
# `wmtp.grading.harness_models()`: the tiny target with wide random weights (so its greedy output varies),
# in float64 (decode.py NOTE [Exactness]).

# %%
target, head = grading.harness_models()
V, K, N = target.config.vocab_size, 4, 40
prompt = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(0))
dense = wmtp.greedy_generate(target, prompt, N)
seq = torch.cat([prompt, dense, torch.zeros(K + 2, dtype=torch.long)])  # what the oracle reads from

print(f"{'j':>2} {'steps':>5} {'accept rate':>11} {'mean AL':>8}  accept-length histogram  output == dense")
oracle_stats = {}
for j in range(K + 1):
    out, stats = wmtp.speculative_generate(target, grading.OracleDraft(head, seq, j, V), prompt, N, K)
    assert torch.equal(out, dense), f"j={j}: output changed"
    oracle_stats[j] = stats
    print(f"{j:>2} {stats.steps:>5} {stats.acceptance_rate:>11.2f} {stats.mean_accept_length:>8.2f}  "
          f"{str(stats.accept_length_histogram):<24} {torch.equal(out, dense)}")

# %% [markdown]
# Acceptance goes from 0 to 100 % and the number of target passes from about `N` to about `N / (K + 1)`; the tokens
# never change. The windowed head of Windowed-MTP is just a draft that is right less often: it lives
# somewhere on this table, and its output is the dense output too.
#
# **What a wrong verifier does.** Accept one draft past the first mismatch (a classic off-by-one) and the
# output is no longer the target's:

# %%
def accept_one_too_many(drafts: torch.Tensor, target_choice: torch.Tensor) -> int:
    return min(verify_greedy(drafts, target_choice) + 1, drafts.shape[0])


out, _ = wmtp.speculative_generate(target, grading.OracleDraft(head, seq, 1, V), prompt, N, K,
                                   verifier=accept_one_too_many)
first = next(i for i, (a, b) in enumerate(zip(out.tolist(), dense.tolist())) if a != b)
assert not torch.equal(out, dense)
print(f"off-by-one verifier: output departs from dense greedy at token {first}")

# %% [markdown]
# ## Measure
#
# The accept-length histogram of `SpecStats` is the figure of merit of a draft: `mean_accept_length`
# (the paper's AL, tokens per target pass) is `committed / steps`, the tokens the steps add to the
# output: `1 + sum(a * hist[a]) / steps`, less the drafts a last step accepted past `max_new_tokens`
# or `eos_id`. For a realistic spread
# we script a draft that is right at each draft position with probability `p`, independently (it reuses
# the oracle's mechanism, deciding per draft instead of by a fixed `j`). Its accept length is then a
# truncated geometric: `P(a) = p^a (1 - p)` for `a < K` and `P(K) = p^K`.

# %%
class CoinDraft(grading.OracleDraft):
    """An oracle draft whose every draft is right with probability p (the first wrong one ends acceptance)."""

    def __init__(self, head, sequence, vocab, p, seed):
        super().__init__(head, sequence, 0, vocab)
        self.p, self.rng = p, random.Random(seed)

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        last = float(hidden[0, -1, 0])  # OracleDraft's protocol: the draft index rides in the hidden state
        index = int(last - self.SENTINEL) + 1 if last >= self.SENTINEL else 0
        self.j = index + 1 if self.rng.random() < self.p else index  # OracleDraft is right iff index < j
        return super().__call__(hidden, next_ids, pos, cache, n_sink, window, impl)


N_LONG = 300
dense_long = wmtp.greedy_generate(target, prompt, N_LONG)
seq_long = torch.cat([prompt, dense_long, torch.zeros(K + 2, dtype=torch.long)])
fig, axes = plt.subplots(1, 3, figsize=(12, 3.5), sharey=True)
for ax, p in zip(axes, (0.5, 0.7, 0.9)):
    out, stats = wmtp.speculative_generate(target, CoinDraft(head, seq_long, V, p, seed=1), prompt, N_LONG, K)
    assert torch.equal(out, dense_long)
    hist = torch.tensor(stats.accept_length_histogram, dtype=torch.float64)
    theory = torch.tensor([p**a * (1 - p) for a in range(K)] + [p**K])
    ax.bar(range(K + 1), hist / hist.sum(), label="measured")
    ax.plot(range(K + 1), theory, "ko--", label="theory")
    ax.set_title(f"p = {p}: mean AL {stats.mean_accept_length:.2f}")
    ax.set_xlabel("drafts accepted in a step")
axes[0].set_ylabel("fraction of steps")
axes[0].legend()
fig.tight_layout()

# %% [markdown]
# ## The same loop, without reading the device
#
# The loop above reads the device at every step: the accepted count `a` decides how many positions the
# draft head consumes next (`a + 1`), and the host builds the next step's positions from it. On a GPU
# each read waits for all queued work, and each Python call launches its kernels one by one: for a small
# model the host, not the GPU, sets the pace. `wmtp.static_speculative_generate` decodes the same way
# with steps whose shapes do not depend on what the device computed, so that a step can be captured
# once in a CUDA graph and replayed:
#
# - the draft extend consumes `K + 1` positions, those of the last verify pass (one at the first
#   step), of which rows `0 .. a` are real, and picks row `a` on the device. The rows past `a` write draft-KV entries at
#   positions that the next drafts rewrite before anything reads them: the caches are position-indexed,
#   and a query only reads keys at or before its own position (NOTE [Static extend] in
#   `wmtp/static_decode.py`);
# - accepted drafts equal the target's choices, so the next extend's tokens are simply `y_0 .. y_K`;
# - the host reads one small tensor a step (`a` and the choices), to count and to stop.
#
# So a draft must now answer on every row, not only the last. This oracle looks each row's answer up by
# its position, with tensor operations only:

# %%
class RowOracle:
    """Right for the first j drafts of every step, on every row (the draft index rides in the hidden state)."""

    def __init__(self, sequence: torch.Tensor, j: int):
        self.seq, self.j = sequence, j

    def new_cache(self, *args, **kwargs):
        return head.new_cache(*args, **kwargs)

    def write_cache(self, *args):  # the prefill: the head's keys and values, no drafts
        return head.write_cache(*args)

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        lead = hidden[0, :, 0]  # (L,)
        index = torch.where(lead >= 1e6, (lead - 1e6).long() + 1, 0)  # 0 on rows fed the target's states
        truth = self.seq[(pos + 2).clamp(max=len(self.seq) - 1)]  # (L,) the dense token two ahead
        token = torch.where(index < self.j, truth, (truth + 1) % V)
        logits = torch.nn.functional.one_hot(token, V).to(hidden.dtype)[None]  # (1, L, V)
        return logits, (1e6 + index.to(hidden.dtype))[None, :, None].expand_as(hidden)


print(f"{'j':>2} {'steps':>5} {'mean AL':>8}  histogram as the eager loop's  output == dense")
for j in range(K + 1):
    out, stats = wmtp.static_speculative_generate(target, RowOracle(seq, j), prompt, N, K)
    _, eager = wmtp.speculative_generate(target, RowOracle(seq, j), prompt, N, K)
    assert torch.equal(out, dense) and stats.accept_length_histogram == eager.accept_length_histogram
    print(f"{j:>2} {stats.steps:>5} {stats.mean_accept_length:>8.2f}  {str(stats.accept_length_histogram):<30} "
          f"{torch.equal(out, dense)}")

# %% [markdown]
# The same outputs and the same accepts. The price is work on rows that are thrown away: the extend
# runs `K + 1` queries (after the first step) where the eager loop runs `a + 1`. On the CPU these steps are plain calls;
# on a GPU with the Triton kernels each phase, draft and verify, is one CUDA graph. There the draft-KV
# tax finally shows: on an H200 at 131072 tokens the native draft phase takes 3.6 ms a step and a
# windowed one 1.3 ms, where the eager loop spends about 10 ms a draft phase on launches whatever the
# key set (`wmtp bench decode`; `docs/results/gpu-decode.md` has the tables).

# %% [markdown]
# ## Discussion
#
# **Why the output cannot change.** Suppose the committed prefix equals the dense greedy output so far.
# The step commits `d_1 .. d_a` and `y_a`. Each accepted `d_i` *equals* `y_{i-1}`, the target's argmax
# after the committed prefix plus `d_1 .. d_{i-1}`, which is exactly the token dense greedy decoding
# would produce next; and `y_a` is the target's argmax after the prefix plus the accepted drafts, again
# the next dense token. So the prefix stays equal to the dense output, step after step (induction). The
# draft only decides *how many* tokens each target pass yields. Nothing in this argument mentions how the
# draft computed its guesses: full attention, a 64 + 4096 window or a coin.
#
# **Why acceptance can drop.** A windowed draft reads fewer keys, so it may guess worse: `a` is smaller,
# more target passes are needed, each pass yields fewer tokens. That costs time (notebook 05 puts numbers
# on the trade), never correctness.
#
# **Fine print.** The induction is exact in real arithmetic. In floating point the target's logits for a
# position from a `K + 1`-token verify pass and from a one-token decode pass can differ in the last bits,
# and a near-tie can flip an argmax. That is why these checks run in float64, and why losslessness is
# asserted with `torch.equal` on token ids, never `allclose`.
#
# Try: plug your own verifier into `speculative_generate(..., verifier=fn)` (assignment 03 grades one).
