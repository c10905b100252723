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
# # 01 · The draft key set
#
# ## What you will learn
#
# Windowed-MTP (arXiv 2607.21535) changes exactly one thing in MTP speculative decoding: the keys
# the draft head's attention may read. This notebook takes that key set apart:
#
# - the formula, written once in `wmtp/keyset.py` (explained in `docs/concepts.md#the-key-set`);
# - a naive reference you could write on a whiteboard, and the library's version of it;
# - the mask drawn as a picture, the two key ranges a kernel loops over, the CSR form a batch of
#   queries is packed into;
# - how many keys the draft reads as the context grows: the number the paper is about.
#
# For a draft query at absolute position `t` (0-based; its own key sits at `t`), key `j` is read iff
#
#     j <= t  and  ( j < n_sink  or  j > t - window )
#
# so `window` counts the query's own key, and the set holds `min(t + 1, n_sink + window)` keys.
# With `S = t + 1` keys in the cache this is the paper's `{0 .. n_sink-1} ∪ {S-window .. S-1}`.
# `window=None` is the full causal set (the native MTP head's, and the target's global layers');
# `n_sink=0` is a pure sliding window.

# %%
import matplotlib.pyplot as plt
import torch

import wmtp
from wmtp import keyset

# %% [markdown]
# ## Naive reference
#
# The definition, literally: a set comprehension over every key position `j <= t`.
# No ranges, no tensors, nothing clever, so nothing to get wrong.

# %%
def naive_key_set(t: int, n_sink: int, window: int | None) -> list[int]:
    """Keys a draft query at position t may read, by the definition."""
    if window is None:
        return sorted({j for j in range(t + 1)})
    return sorted({j for j in range(t + 1) if j < n_sink or j > t - window})


print(naive_key_set(19, n_sink=2, window=6))  # two sinks, then the six most recent keys (19 included)
print(naive_key_set(3, n_sink=2, window=6))   # early on, every key is read: sinks and window overlap
print(naive_key_set(7, n_sink=0, window=3))   # n_sink=0: a pure sliding window

# %% [markdown]
# ## Mechanism
#
# The library computes the same set without visiting every `j`. `keyset.key_ranges` turns the
# formula into two disjoint half-open ranges, `sink = [0, a)` and `recent = [b, t + 1)`; this is the
# form the attention reference and the Triton kernel loop over (two contiguous ranges, never a
# gathered copy). `wmtp.draft_key_indices` concatenates them.

# %%
for t in (3, 9, 10, 19):
    sink, recent = keyset.key_ranges(t, n_sink=4, window=6)
    print(f"t={t:2d}  sink range {sink}  recent range {recent}  ->", wmtp.draft_key_indices(t, 4, 6).tolist())

# %% [markdown]
# Note `t = 9`: the sink range `[0, 4)` and the recent range `[4, 10)` touch, so the set is every key.
# At `t = 10` the first gap opens (key 4 is neither a sink nor recent).
#
# The boolean mask `wmtp.draft_key_mask(q_pos, kv_len, n_sink, window)` has one row per query: row `t`
# is the key set of position `t`. Drawn as a picture (yellow = read), the sinks are the vertical
# band on the left and the window the diagonal band; the native head reads the whole lower triangle.

# %%
S = 48
fig, axes = plt.subplots(1, 3, figsize=(12, 4))
for ax, (n_sink, window) in zip(axes, [(0, None), (4, 12), (0, 12)]):
    mask = wmtp.draft_key_mask(torch.arange(S), S, n_sink, window)  # (S, S): row = query t, column = key j
    ax.imshow(mask, cmap="viridis", interpolation="nearest")
    ax.set_title("native (window=None)" if window is None else f"n_sink={n_sink}, window={window}")
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position t")
fig.tight_layout()

# %% [markdown]
# The same picture as text, from the module's own renderer, `keyset.render_mask`:

# %%
print(keyset.render_mask(kv_len=20, n_sink=4, window=6))

# %% [markdown]
# A batch of queries (say the `K` recursive draft positions of several sequences) is packed in
# CSR form: `indptr` (one entry per query, plus one) and `indices` (all key positions, concatenated).
# Row `r` reads `indices[indptr[r]:indptr[r+1]]`. This is what paged and FlashInfer-style sparse
# kernels consume.

# %%
indptr, indices = wmtp.draft_key_csr([torch.tensor([10, 11]), torch.tensor([3])], n_sink=2, window=4)
print("indptr ", indptr.tolist())
print("indices", indices.tolist())
for r in range(len(indptr) - 1):
    print(f"row {r}: keys {indices[indptr[r]:indptr[r + 1]].tolist()}")

# %% [markdown]
# ## Check
#
# The library must agree with the naive definition everywhere, including the corners: `t + 1 <= n_sink`
# (only sinks exist yet), the window overlapping the sinks, `n_sink = 0`, `window = 1` (the query's own
# key only) and `window = None`. We compare on a grid: indices, mask rows, CSR rows and `key_count`.

# %%
cases = 0
for n_sink in range(0, 6):
    for window in [None, *range(1, 9)]:
        pos = torch.arange(30)
        mask = wmtp.draft_key_mask(pos, 30, n_sink, window)
        indptr, indices = wmtp.draft_key_csr(pos, n_sink, window)
        for t in range(30):
            want = naive_key_set(t, n_sink, window)
            assert wmtp.draft_key_indices(t, n_sink, window).tolist() == want, (t, n_sink, window)
            assert torch.nonzero(mask[t]).flatten().tolist() == want, (t, n_sink, window)
            assert indices[indptr[t]:indptr[t + 1]].tolist() == want, (t, n_sink, window)
            assert keyset.key_count(t, n_sink, window) == len(want)
            if window is not None:
                assert len(want) == min(t + 1, n_sink + window)
            cases += 1
print(f"naive == library on {cases} (t, n_sink, window) cases")

# %% [markdown]
# ## Measure
#
# How many keys does one draft query read at context `S` (query at `t = S - 1`)? The native head reads
# all `S`; a windowed head reads at most `n_sink + window`, whatever the context. We compare the paper's
# setting (64 sinks + 4096 recent keys) with a small one (8 + 64), from 1K to 1M tokens.

# %%
contexts = [2**i for i in range(10, 21)]  # 1K .. 1M
settings = {"native": (0, None), "64 + 4096": (64, 4096), "8 + 64": (8, 64)}
counts = {name: [keyset.key_count(S - 1, *ks) for S in contexts] for name, ks in settings.items()}

print(f"{'context':>9} " + " ".join(f"{name:>11}" for name in settings))
for i, S in enumerate(contexts):
    print(f"{S:>9} " + " ".join(f"{counts[name][i]:>11}" for name in settings))

fig, ax = plt.subplots(figsize=(6, 4))
for name, ys in counts.items():
    ax.loglog(contexts, ys, marker="o", label=name)
ax.set_xlabel("context S (tokens)")
ax.set_ylabel("keys read per draft query")
ax.set_title("Draft keys read vs context")
ax.legend()
fig.tight_layout()

# %%
S = 2**20
print(f"at S = {S}: 64 + 4096 reads {counts['64 + 4096'][-1] / S:.2%} of the keys; "
      f"8 + 64 reads {counts['8 + 64'][-1] / S:.4%}")

# %% [markdown]
# ## Discussion
#
# - The key set is one formula. Everything else (ranges, index lists, masks, CSR) is derived from it
#   and checked against it, so there is exactly one place where an off-by-one could live.
# - `window` counts the query's own key. Libraries disagree on this (some windows hold `W + 1` keys);
#   here `draft_key_indices(19, 2, 6)` is `[0, 1, 14, ..., 19]`: 2 + 6 keys.
# - While every draft query of a step sits at a position below `n_sink + window`, the windowed head reads
#   exactly what the native head reads, so it drafts identically (a step's later drafts sit a few
#   positions past its context, so they cross that line first). Past it, its reads stay flat while the
#   native head's grow linearly: that growing read is the *draft-KV tax* of notebook 05.
# - Reading fewer keys can make drafts worse (fewer of them accepted), never the output: the target
#   verifies every draft with its own, unchanged attention, as in dense decoding (notebook 03).
#
# Try: change `settings` to your own `(n_sink, window)`, or draw the mask for `n_sink=0, window=1`.
