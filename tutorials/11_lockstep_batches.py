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
# # 11 · Lockstep batches
#
# ## What you will learn
#
# The paper decodes one sequence at a time. A server decodes many, and a batch lets one pass of the
# head and of the target serve them all. The simplest batched speculative decoding keeps every row at
# one position: each step, row `b` accepts `a_b` of its `K` drafts, and the batch commits
#
#     m = min_b a_b
#
# drafts of every row, then each row's own target token. You will see why every row is still its own
# dense greedy decoding, check it token for token, watch `m` follow the least of the rows' matches,
# compute what that costs in accept length as the batch grows (`1 + sum_i alpha^(i B)`), and read the
# committed CPU measurement, where plain dense batching wins. Then rows at their own positions
# (`wmtp.batched_speculative_generate`), each keeping its own matches, and rows that refill from a queue
# of prompts (`max_batch`, `prefill_batch`), each checked token for token and read in committed H200 runs.

# %%
import json
from pathlib import Path

import torch

import wmtp
from wmtp.grading import harness_models

torch.manual_seed(0)
target, head = harness_models()  # the tiny preset in float64, weights drawn wide (greedy output varies)
V = target.config.vocab_size
prompts = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(1))  # (B, P)
print("prompts:", tuple(prompts.shape))

# %% [markdown]
# ## Naive reference
#
# Decode each prompt alone, densely: the output every batched method must reproduce, row for row.

# %%
NEW = 24
alone = [wmtp.greedy_generate(target, p, NEW) for p in prompts]
for b, out in enumerate(alone):
    print(f"row {b}:", out.tolist()[:12], "...")

# %% [markdown]
# ## Mechanism
#
# One step by hand. Each row drafts `K` tokens; one target pass over `[x, d_1 .. d_K]` of every row
# gives each row's greedy choice after each prefix; `a_b` is the length of the matching prefix
# (`verify_greedy`'s cumprod, row by row). The batch keeps `m = min_b a_b` drafts of every row and
# then `choice[b, m]`.
#
# Why is that each row's greedy decoding? Row `b`'s first `m` drafts equal its target's choices, so
# positions up to `n + m` are its greedy chain, and `choice[b, m]` is its target's greedy token after
# that chain. A row that matched more than `m` simply keeps fewer tokens this step: its cache entries
# past `n + m` are overwritten by the next step, which starts at `n + m + 1` for every row (the caches
# are position-indexed, as for a rejected draft).

# %%
K = 4
drafts = torch.tensor([[5, 7, 9, 2], [5, 7, 1, 1], [5, 7, 9, 3]])  # (B, K) made-up drafts
choice = torch.tensor([[5, 7, 9, 2, 8], [5, 7, 9, 4, 6], [5, 7, 9, 3, 0]])  # (B, K+1) made-up choices
a = (drafts == choice[:, :K]).long().cumprod(dim=1).sum(dim=1)  # (B,) each row's own match
m = int(a.min())
kept = torch.cat([drafts[:, :m], choice[:, m:m + 1]], dim=1)  # (B, m + 1)
print("a_b =", a.tolist(), " m =", m)
print("kept this step:", kept.tolist())

# %% [markdown]
# ## Check
#
# `wmtp.lockstep_generate` runs that step until every row has its tokens, and
# `wmtp.batched_greedy_generate` is the dense batch. Both equal the reference row for row (float64:
# a row of a batched product may round differently from the same row alone, NOTE [Batch exactness]
# in wmtp/lockstep.py). The random head matches little, so an *oracle* head shows `m` at work: it
# runs the real head but replaces its guesses, right for the first `j(b, n)` drafts of row `b` at
# the step from position `n`, then wrong.

# %%
dense = wmtp.batched_greedy_generate(target, prompts, NEW)
lock, stats = wmtp.lockstep_generate(target, head, prompts, NEW, K, 4, 16)
assert all(torch.equal(x, y) for x, y in zip(dense, alone)) and all(torch.equal(x, y) for x, y in zip(lock, alone))
print("dense batch and lockstep equal every row's greedy decoding; random head's AL:", stats.mean_accept_length)

truth = torch.cat([prompts, torch.stack([wmtp.greedy_generate(target, p, NEW + K + 2) for p in prompts])], dim=1)


def j(b, n):  # drafts row b gets right at the step verifying from position n
    return (7 * n + b) % (K + 1)


class Oracle:
    """The real head with its guesses replaced (a recursive call passes a view of the last output)."""

    def __init__(self):
        self.last, self.index = None, 0

    def new_cache(self, *args, **kwargs):
        return head.new_cache(*args, **kwargs)

    def write_cache(self, *args):  # the prefill: the head's keys and values, no drafts
        return head.write_cache(*args)

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        last = self.last
        recursive = last is not None and hidden.untyped_storage().data_ptr() == last.untyped_storage().data_ptr()
        self.index = self.index + 1 if recursive else 0
        logits, self.last = head(hidden, next_ids, pos, cache, n_sink, window, impl)
        t = int(pos[-1])
        n = t + 1 - self.index
        right = torch.tensor([self.index < j(b, n) for b in range(hidden.shape[0])])
        tok = truth[:, t + 2]
        tok = torch.where(right, tok, (tok + 1) % V)
        out = torch.zeros_like(logits)
        out[:, -1].scatter_(1, tok[:, None], 1.0)
        return out, self.last


class Record:
    """A fixed depth that records what each step was told."""

    max_depth = K

    def __init__(self):
        self.steps = []

    def depth(self, position):
        self.steps.append(position)
        return K

    def update(self, depth, accepted, draft_s, verify_s):
        self.steps[-1] = (self.steps[-1], accepted)


policy = Record()
lock, stats = wmtp.lockstep_generate(target, Oracle(), prompts, NEW, policy)
assert all(torch.equal(x, y) for x, y in zip(lock, alone))
for n, got in policy.steps[:6]:
    print(f"step at n={n}: rows' matches {[min(j(b, n), K) for b in range(3)]} -> m = {got}")
    assert got == min(min(j(b, n), K) for b in range(3))
print(f"AL {stats.mean_accept_length:.2f}; the rows' own matches would have kept "
      f"{1 / stats.lockstep_efficiency:.2f}x as many tokens")

# %% [markdown]
# ## Measure
#
# If every draft of every row is accepted with probability `alpha` once the ones before it were, and
# rows are independent, a row alone keeps `1 + alpha + ... + alpha^K` tokens a step, and a batch of
# `B` keeps
#
#     E[AL | K, B] = 1 + sum_{i=1..K} alpha^(i B)
#
# (all `B` rows must accept draft `i`). The batch's accept length collapses toward 1 as `B` grows.

# %%
alpha = 0.8
print("B  E[AL | K=7, B]")
for B in (1, 2, 4, 8):
    print(f"{B}  {1 + sum(alpha ** (i * B) for i in range(1, 8)):.2f}")

# %% [markdown]
# The committed CPU run (`metrics/experiments/lockstep-cpu-exp33.json`: WikiText-2 small models,
# float64, 2-core CPU; docs/results/lockstep.md) shows the same collapse, and what it costs against
# plain dense batching:

# %%
root = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "pyproject.toml").exists()), Path.cwd())
path = root / "metrics" / "experiments" / "lockstep-cpu-exp33.json"
if path.exists():
    run = json.loads(path.read_text())
    print("B  AL(lockstep 8+64)  ms/token/row: alone  dense batch  lockstep  lockstep adaptive")
    for row in run["rows"]:
        ms = {k: v["ms_per_token_per_row"] for k, v in row["methods"].items()}
        print(f"{row['B']}  {row['methods']['lockstep/sink8+win64']['mean_accept_length']:17.2f}"
              f"  {ms['dense_alone']:18.3f}  {ms['dense_batch']:11.3f}  {ms['lockstep/sink8+win64']:8.3f}"
              f"  {ms['lockstep-adaptive/sink8+win64']:17.3f}")
else:
    print("no committed run here:", path)

# %% [markdown]
# On a GPU the eager loop is bound by the host's kernel launches, so it cannot say what a batch costs
# the device. `wmtp.static_lockstep_generate` is the same loop with device-resident steps, each phase
# one CUDA graph (`wmtp/static_lockstep.py`); off CUDA it runs eagerly, and its rows and counters
# are the eager loop's (the harness head is untrained, so its drafts rarely match and AL is near 1
# here; the run below uses trained models):

# %%
static, static_stats = wmtp.static_lockstep_generate(target, head, prompts, NEW, K, 4, 16)
eager, eager_stats = wmtp.lockstep_generate(target, head, prompts, NEW, K, 4, 16)
assert [x.tolist() for x in static] == [x.tolist() for x in eager]
assert (static_stats.steps, static_stats.accepted) == (eager_stats.steps, eager_stats.accepted)
print(f"static loop: {static_stats.steps} steps, AL {static_stats.mean_accept_length:.2f}, as the eager loop")

# %% [markdown]
# The committed H200 run (`metrics/experiments/lockstep-graph-h200-exp34.json`: the same models in
# float32, the CUDA-graph loops, 1024-token prompts) times the graphs' device seconds:

# %%
path = root / "metrics" / "experiments" / "lockstep-graph-h200-exp34.json"
if path.exists():
    run = json.loads(path.read_text())
    print("B   us/token/row: dense batch  lockstep 8+64 adaptive  (AL)")
    for row in (r for r in run["rows"] if r["context"] == 1024):
        dense, lock = row["methods"]["dense_batch"], row["methods"]["lockstep-adaptive/sink8+win64"]
        print(f"{row['B']:<3} {dense['us_per_token_per_row']:27.1f}  {lock['us_per_token_per_row']:22.1f}"
              f"  ({lock['mean_accept_length']:.2f})")
else:
    print("no committed run here:", path)

# %% [markdown]
# Rows need not wait for the slowest. `wmtp.batched_speculative_generate` (wmtp/batched.py) gives
# every row its own positions: the attention ops, RoPE, the caches and the models take positions of
# shape `(B, L)`, so each row keeps its own `a_b + 1` tokens a step and moves on by them, and prompts
# may even differ in length. The oracle above reads one position for the whole batch; this one reads
# each column's own. At a fixed depth a step's head calls are an extend and `K - 1` recursive drafts,
# so a call's index in its step is its count modulo `K` (the prompts' chains are `write_cache`'s).

# %%
class RowOracle:
    """The real head with its guesses replaced, each column at its own position ``t``."""

    def __init__(self):
        self.calls = 0

    def new_cache(self, *args, **kwargs):
        return head.new_cache(*args, **kwargs)

    def write_cache(self, *args):
        return head.write_cache(*args)

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        logits, g = head(hidden, next_ids, pos, cache, n_sink, window, impl)
        index, self.calls = self.calls % K, self.calls + 1
        t = pos.expand(next_ids.shape)  # (B, L) each column's position
        right = torch.tensor([[index < j(b, int(x) + 1 - index) for x in row] for b, row in enumerate(t)])
        tok = truth.gather(1, (t + 2).clamp(max=truth.shape[1] - 1))  # (B, L) the token a draft there guesses
        out = torch.zeros_like(logits)
        out.scatter_(2, torch.where(right, tok, (tok + 1) % V)[..., None], 1.0)
        return out, g


own, own_stats = wmtp.batched_speculative_generate(target, RowOracle(), prompts, NEW, K)
assert all(torch.equal(x, y) for x, y in zip(own, alone))
print(f"own positions: AL {own_stats.mean_accept_length:.2f} (lockstep {stats.mean_accept_length:.2f}), "
      f"drafts each row accepted: {own_stats.accepted}")

# %% [markdown]
# Its CUDA-graph form, `wmtp.static_batched_speculative_generate`, on the H200
# (`metrics/experiments/batched-graph-h200-exp44.json`: the trained models, float32, 1024-token
# prompts, 8 + 64 at depth 7):

# %%
path = root / "metrics" / "experiments" / "batched-graph-h200-exp44.json"
if path.exists():
    run = json.loads(path.read_text())
    print("B   us/token/row: dense batch  lockstep (AL)  own positions (AL)")
    for row in run["rows"]:
        d, lo, ow = (row["methods"][k] for k in ("dense_batch", "lockstep/sink8+win64", "own_positions/sink8+win64"))
        print(f"{row['B']:<3} {d['us_per_token_per_row']:27.1f}  {lo['us_per_token_per_row']:7.1f} "
              f"({lo['mean_accept_length']:.2f})  {ow['us_per_token_per_row']:13.1f} ({ow['mean_accept_length']:.2f})")
else:
    print("no committed run here:", path)

# %% [markdown]
# A batch with a position a row still steps until its slowest row is done: a row that finished early
# rides along. With more prompts than rows, `max_batch` refills instead: a row whose prompt has
# stopped takes the next waiting one (continuous batching, NOTE [Refill] in wmtp/batched.py). The
# prompt is prefilled alone straight into the row's first positions of both caches (`KVCache.row`: a
# one-row view of them); what the row's earlier prompt left past them is rewritten before any query
# reads it. Five prompts of different lengths in two rows, each its greedy decoding alone:

# %%
queue = [torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(n)) for n in (6, 15, 3, 11, 8)]
refilled, refill_stats = wmtp.batched_speculative_generate(target, head, queue, NEW, K, 4, 16, max_batch=2)
assert all(torch.equal(x, wmtp.greedy_generate(target, p, NEW)) for x, p in zip(refilled, queue))
print(f"{len(queue)} prompts in 2 rows: {refill_stats.steps} steps; each prompt's live steps:",
      refill_stats.live_steps)

# %% [markdown]
# Each prompt that takes a row is prefilled alone, one at a time. `prefill_batch=2` prefills the
# waiting prompts two at a time as one batch instead, and copies each into a row when one frees
# up: the same outputs and steps, the three waiting prompts prefilled in two passes instead of three
# (`prefill_times_s` times the first rows' prefill and each admission, a copy included).

# %%
staged, staged_stats = wmtp.batched_speculative_generate(target, head, queue, NEW, K, 4, 16, max_batch=2,
                                                         prefill_batch=2)
assert all(torch.equal(x, y) for x, y in zip(staged, refilled)) and staged_stats.steps == refill_stats.steps
print("admissions timed:", len(staged_stats.prefill_times_s), "| each prompt's first and last token (ms):",
      [(round(f * 1e3, 1), round(d * 1e3, 1)) for f, d in zip(staged_stats.first_token_s, staged_stats.done_s)])

# %% [markdown]
# On the H200 (`metrics/bench-batch-h200-refill-16k.json`, `wmtp bench batch --prompts-per-row 4`:
# reproduce's models, float32, CUDA graphs, 16384-token prompts, 8 + 64), 4 B prompts in B rows,
# against the same rows in waves of B and the dense batch in waves:

# %%
path = root / "metrics" / "bench-batch-h200-refill-16k.json"
if path.exists():
    run = json.loads(path.read_text())
    print("lengths  B   us/token: dense batch  waves (steps)  refill (steps)")
    for row in run["rows"]:
        d, w, r = (row["methods"][k] for k in ("dense batch", "own positions sink8+win64", "refill sink8+win64"))
        print(f"{row['lengths']:<8} {row['batch']:<3} {d['us_per_token_per_row']:22.1f}  "
              f"{w['us_per_token_per_row']:5.1f} ({w['steps']})  {r['us_per_token_per_row']:7.1f} ({r['steps']})")
else:
    print("no committed run here:", path)

# %% [markdown]
# Those times leave out the prefills. A server pays them too: a wave prefills its B prompts as one
# batch, a refilling batch each later prompt alone as a row frees up or, with `prefill_batch`, the
# next waiting prompts together (`refill staged`). Since a prefill's attention runs in one launch a
# layer (NOTE [Chunks] in wmtp/attention/triton_attention.py) a prompt alone costs about its share
# of a batched prefill at 16384 tokens; at 1024 tokens a forward's fixed launches still show. The same
# cells timed with their prefills (`metrics/bench-batch-h200-chunks.json`), µs a token of a prompt,
# decode steps alone / with the prefills:

# %%
path = root / "metrics" / "bench-batch-h200-chunks.json"
if path.exists():
    run = json.loads(path.read_text())
    names = ("dense batch", "own positions sink8+win64", "refill sink8+win64", "refill staged sink8+win64")
    print("context lengths  B      dense batch            waves           refill    refill staged")
    for row in run["rows"]:
        cells = [row["methods"][k] for k in names]
        print(f"{row['context']:<7} {row['lengths']:<8} {row['batch']:<3}" + "".join(
            f"  {m['us_per_token_per_row']:5.1f} / {m['us_per_token_per_row_with_prefill']:5.1f}" for m in cells))
else:
    print("no committed run here:", path)

# %% [markdown]
# ## Discussion
#
# - Lockstep is exact for every row and needs nothing new from the caches or the kernels: all rows
#   sit at one position, as in one sequence.
# - Its price is acceptance: the batch keeps the least match, and `E[AL | K, B]` falls fast with `B`.
#   Drafting less helps (`wmtp.AdaptiveDepth`, told each step's `m`), but on the committed CPU run a
#   plain dense batch is still faster from two prompts on. Our reading (not measured): batching and
#   speculation draw on the same spare capacity of a step there.
# - A GPU step of these small models is launch-bound (docs/results/step-anatomy.md), so a batch costs
#   little more than one row there: on the H200 a dense step of 64 rows took 2.5 times one row's
#   device time. Lockstep gains from batching too, but its acceptance falls as rows are added:
#   adaptive lockstep beat the dense batch by 6-7 % at two prompts, and from four on the dense batch
#   was faster (docs/results/lockstep.md).
# - Rows that keep their own matches need a position per row: in the attention ops (`q_pos` of
#   shape `(B, Lq)`), the cache writes and RoPE. wmtp has them (`wmtp/batched.py`,
#   `wmtp/static_batched.py`): no row waits for the slowest, each keeps its AL, and on the H200 that
#   took 23-70 % less device time a token than lockstep from two prompts; the dense batch of the same
#   size was still about as fast or faster (docs/results/lockstep.md).
# - Such a batch steps until its slowest row is done. Refilling a stopped row with the next prompt
#   removes that wait: on the H200, 64 prompts of 16384 tokens in 16 refilling rows took 29.6 % less
#   time a token than waves of 16, and 9.7 % less than the dense batch (a +10.7 % speedup; prefills
#   excluded).
# - With the prefills counted, and 128 new tokens a prompt, the prefills are most of a prompt's time.
#   In the run above (`bench-batch-h200-chunks.json`) refilling beats the same rows in waves at 16384
#   tokens, but the dense batch stays the fastest in every cell; at 1024 tokens a prompt prefilled
#   alone still pays a forward's fixed launches, and `prefill_batch` (`refill staged`) wins most of
#   that back. Since the prefills got lighter (`metrics/bench-batch-h200-prefill-writes.json`)
#   refilling trails the dense batch at 16384 tokens by speedups of −10.1 % to −0.5 %
#   (docs/results/lockstep.md, "With the prefills").
