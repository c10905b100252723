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
# # 08 · Re-indexed key positions
#
# ## What you will learn
#
# The Windowed-MTP draft reads its sinks and a recent window, and every key keeps the RoPE of its true
# position (the paper's choice). StreamingLLM made another: inside its cache, key `i` sits at position
# `i`. This notebook shows that the second choice needs no second cache. RoPE scores depend only on the
# distance between query and key, so re-indexing moves only the sinks, and it is enough to score them
# with the query rotated to
#
#     sink_query_position(t) = min(t, n_sink + window - 1)
#
# (`wmtp/keyset.py`). You will build the re-indexed attention the slow way (a compact cache, rotated
# again), derive the shortcut, check that both agree for both attention impls, and decode with it.
#
# Without a CUDA device the Triton kernel runs under Triton's interpreter, as in notebook 04: the first
# code cell sets `TRITON_INTERPRET=1`, which Triton reads when it is imported (nothing here imports it
# before the Check cell).

# %%
import json
import math
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU: the Check cell's impl="triton" runs in Triton's interpreter

import wmtp  # noqa: E402
from wmtp.block import apply_rope  # noqa: E402
from wmtp.grading import harness_models  # noqa: E402
from wmtp.keyset import draft_key_indices, reindexed_key_positions, sink_query_position  # noqa: E402

THETA = 10000.0
g = torch.Generator().manual_seed(0)

# %% [markdown]
# ## Naive reference
#
# Keep the keys *unrotated*; for a query at `t`, gather its key set into a compact cache, rotate the keys
# to their index in it (`0, 1, 2, ...`) and the query to the last index, and attend. This is what a
# StreamingLLM cache does, one query at a time.

# %%
N_SINK, WINDOW, S, D = 2, 6, 20, 16
k_raw = torch.randn(1, 1, S, D, generator=g, dtype=torch.float64)  # (B, Hkv, S, D) before RoPE
v = torch.randn(1, 1, S, D, generator=g, dtype=torch.float64)
q_raw = torch.randn(1, 1, 1, D, generator=g, dtype=torch.float64)  # (B, Hq, Lq, D) one query at t = 19
t = S - 1


def naive_reindexed(q_raw, k_raw, v, t):
    idx = draft_key_indices(t, N_SINK, WINDOW)
    key_pos, query_pos = reindexed_key_positions(t, N_SINK, WINDOW)
    k = apply_rope(k_raw[:, :, idx], key_pos, THETA)  # keys at 0 .. n-1
    q = apply_rope(q_raw, torch.tensor([query_pos]), THETA)  # the query at n-1
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1) @ v[:, :, idx]


print("key set of t = 19:          ", draft_key_indices(t, N_SINK, WINDOW).tolist())
print("their re-indexed positions: ", reindexed_key_positions(t, N_SINK, WINDOW)[0].tolist(),
      " query at", reindexed_key_positions(t, N_SINK, WINDOW)[1])

# %% [markdown]
# ## Mechanism
#
# RoPE rotates a vector at position `p` by angles `p * theta_i`, so a score between a query at `a` and a
# key at `b` depends only on `a - b`. Compare the distances in the two worlds:

# %%
idx = draft_key_indices(t, N_SINK, WINDOW).tolist()
key_pos, query_pos = reindexed_key_positions(t, N_SINK, WINDOW)
print(f"{'key':>4} {'absolute distance':>18} {'re-indexed distance':>20}")
for j, p in zip(idx, key_pos.tolist()):
    print(f"{j:>4} {t - j:>18} {query_pos - p:>20}")

# %% [markdown]
# Every recent key keeps its distance `t - j`: the window shifts by the same amount as the query. Only
# the sinks move, to the distance from `min(t, n_sink + window - 1)`. So keep the cache as it is (keys
# rotated at their true positions, as the model writes them) and score the sinks with a second query,
# rotated to `sink_query_position(t)`. That is the attention ops' `q_sink` argument: the reference
# replaces its sink columns, the Triton kernel scores its sink range with a second query tile.

# %%
k = apply_rope(k_raw, torch.arange(S), THETA)  # the cache as the model writes it
q = apply_rope(q_raw, torch.tensor([t]), THETA)
q_sink = apply_rope(q_raw, torch.tensor([sink_query_position(t, N_SINK, WINDOW)]), THETA)
print("sink_query_position(19, 2, 6) =", sink_query_position(t, N_SINK, WINDOW))
fast = wmtp.attention(q, k, v, torch.tensor([t]), N_SINK, WINDOW, impl="torch", q_sink=q_sink)

# %% [markdown]
# ## Check
#
# The shortcut against the naive compact cache, for the reference and for the Triton kernel (on CPU it
# runs under Triton's interpreter), and absolute positions for contrast:

# %%
expected = naive_reindexed(q_raw, k_raw, v, t)
print("torch  q_sink vs compact cache:", (fast - expected).abs().max().item())
triton = wmtp.attention(q, k, v, torch.tensor([t]), N_SINK, WINDOW, impl="triton", q_sink=q_sink)
print("triton q_sink vs compact cache:", (triton - expected).abs().max().item())
absolute = wmtp.attention(q, k, v, torch.tensor([t]), N_SINK, WINDOW, impl="torch")
print("absolute positions vs compact cache:", (absolute - expected).abs().max().item(), "(a different choice)")
assert torch.allclose(fast, expected, atol=1e-12) and torch.allclose(triton, expected, atol=1e-12)

# %% [markdown]
# Until the key set first evicts a key (`t < n_sink + window`), nothing moves: `sink_query_position(t)`
# is `t` itself.

# %%
print([sink_query_position(p, N_SINK, WINDOW) for p in range(12)])

# %% [markdown]
# ## Measure
#
# Decoding with re-indexed positions changes the drafts, never the output: on the test models, with the
# same prompt, both choices give exactly the dense greedy tokens.

# %%
target, head = harness_models()
prompt = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(3))
dense = wmtp.greedy_generate(target, prompt, 24)
for positions in ("absolute", "reindexed"):
    out, stats = wmtp.speculative_generate(target, head, prompt, 24, 3, 4, 8, positions=positions)
    print(f"{positions:>10}: equal to dense decoding: {torch.equal(out, dense)}")
    assert torch.equal(out, dense)

# %% [markdown]
# Does it change acceptance? `wmtp bench positions` answered that for reproduce's small WikiText-2 models
# (`docs/results/positions.md`), pairing both choices on the same output. Its committed JSON, greedy rows,
# then experiment 20's share of the head's attention that lands on the sinks, beside their share of the keys:

# %%
ROOT = Path.cwd() if (Path.cwd() / "metrics").is_dir() else Path.cwd().parent  # the repo root, or tutorials/
bench = json.loads((ROOT / "metrics/bench-positions-cpu.json").read_text())
print(f"{'context':>8} {'key set':>15} {'AL absolute':>12} {'AL re-indexed':>14}")
for row in (r for r in bench["rows"] if r["temperature"] == 0):
    for label, arm in row["arms"].items():
        a, b = (arm["positions"][p]["mean_accept_length"] for p in ("absolute", "reindexed"))
        print(f"{row['context']:>8} {label:>15} {a:>12.2f} {b:>14.2f}")
mass = json.loads((ROOT / "metrics/experiments/sink-mass-cpu-exp20.json").read_text())
for ks in mass["keysets"]:
    print(f"sinks' share of the head's attention, {ks['n_sink']} + {ks['window']}: "
          f"{ks['absolute']['mean']:.1%} absolute, {ks['reindexed']['mean']:.1%} re-indexed "
          f"({ks['n_sink'] / (ks['n_sink'] + ks['window']):.1%} of the keys)")

# %% [markdown]
# Mostly unchanged, a step or two either way elsewhere: that head gives its sinks less attention than
# their share of the keys, so a sink somewhat less than a recent key, and where the sinks sit changes few
# drafts.

# %% [markdown]
# ## Discussion
#
# - Re-indexing is a statement about distances, and with RoPE only distances matter; so it costs one
#   extra rotated query, not a copy of the cache. (A model with absolute position embeddings, or one
#   that is not a rotation, would not allow this shortcut.)
# - Only the sinks move. A pure sliding window (`n_sink = 0`) and the native draft (`window=None`) are
#   the same under both choices.
# - The paper keeps absolute positions; StreamingLLM needs re-indexing because its model was never trained
#   at the distances the sinks end up at. A draft head trained on short windows meets the same unseen
#   distances, which is why the option exists here, and why it is measured rather than assumed to help.
# - Verification is untouched: the target attends as in dense decoding, with its own key sets and
#   positions, so the output is the target's whichever positions the draft uses.
