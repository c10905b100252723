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
# # 10 · Paged KV caches
#
# ## What you will learn
#
# Serving engines do not give a sequence one contiguous KV cache: they hand out fixed-size **pages**
# from a shared pool, and a **block table** lists a sequence's pages in order (vLLM's layout). Position
# `p` is then row `p % page_size` of page `block_table[p // page_size]`. Windowed-MTP's draft must read
# its key set (arXiv 2607.21535, Sec. 3) from such a cache *in place*, without gathering the context.
# You will build a paged cache by hand, derive the address formula, check that attention over pages
# equals attention over the contiguous cache, decode losslessly from paged caches, count the pages a
# key set touches, and read what pages cost on an H200.

# %%
import json
from pathlib import Path

import torch

import wmtp
from wmtp.attention import attention, paged_attention
from wmtp.attention.paged import PagedView, page_rows, paginate
from wmtp.grading import harness_models
from wmtp.keyset import draft_key_indices
from wmtp.pagedcache import PagedKVCache
from wmtp.prefill import prefill_prompt

g = torch.Generator().manual_seed(0)

# %% [markdown]
# ## Naive reference
#
# A cache of `S = 11` positions, one head of 4 dims, in pages of 4 rows. Draw the sequence's 3 pages
# from a pool of 8 in a random order, and copy each position's row to its place, one at a time.

# %%
S, D, PAGE, POOL = 11, 4, 4, 8
k = torch.randn(S, D, generator=g, dtype=torch.float64)  # (S, D) a contiguous cache, one head
n_pages = -(-S // PAGE)  # ceil(S / PAGE): the sequence's pages
table = torch.randperm(POOL, generator=g)[:n_pages].tolist()  # its pages of the pool, in order
pool = torch.zeros(POOL, PAGE, D, dtype=torch.float64)  # (pages, rows, D)
for p in range(S):
    pool[table[p // PAGE], p % PAGE] = k[p]
print("block table:", table)
print("position -> (page, row):", {p: (table[p // PAGE], p % PAGE) for p in (0, 3, 4, 10)})
assert all(torch.equal(pool[table[p // PAGE], p % PAGE], k[p]) for p in range(S))

# %% [markdown]
# ## Mechanism
#
# `wmtp.attention.paged.page_rows` is the one definition of that address, for a batch: it returns the
# page of every (sequence, position) and the row. `PagedView` wraps the pages as a position-indexed
# `(B, Hkv, S, D)` cache whose slices gather only the positions asked for, which is how the reference
# attention reads a paged cache: range by range, the sinks and the window, never the whole context.

# %%
block_table = torch.tensor([table], dtype=torch.int32)  # (B, pages)
page, row = page_rows(block_table, PAGE, torch.arange(S))  # (B, S), (S,)
print("pages:", page[0].tolist())
print("rows: ", row.tolist())
view = PagedView(pool[:, :, None, :], block_table, S)  # pages as (pages, rows, Hkv, D)
print("view shape (B, Hkv, S, D):", view.shape)
assert torch.equal(view[:, :, 5:9][0, 0], k[5:9])  # positions 5..8 gathered through the table

# %% [markdown]
# A key set touches few pages. Count the distinct pages the draft query at the last position reads, for
# a 1M-token context in pages of 16:

# %%
T, PAGE_16 = 1_048_575, 16
for n_sink, window in ((0, None), (64, 4096), (8, 64)):
    keys = draft_key_indices(T, n_sink, window)
    pages = torch.unique(keys // PAGE_16).numel()
    label = "native" if window is None else f"{n_sink} + {window}"
    print(f"{label:>10}: {keys.numel():>8} keys in {pages:>6} pages")

# %% [markdown]
# The sinks and the window are two runs of consecutive positions, so a windowed set touches
# `ceil(n_sink / 16) + ceil(window / 16)` pages or one more (a run need not start at a page boundary).
# The paged Triton kernel loops over those pages, looking each up in the block table
# (`wmtp/attention/triton_attention.py`, NOTE [Pages]); notebook 04 runs it.

# %% [markdown]
# ## Check
#
# Attention over the pages equals attention over the contiguous cache, for every key set. `paginate`
# scatters a contiguous cache into randomly permuted pages. Both read the same keys in the same order,
# so in float64 they agree to 1e-12, which is what the cell asserts (on this CPU they agree bit for bit;
# another BLAS may sum in another order and differ in the last bits).

# %%
B, Hq, Hkv, S2, D2 = 1, 4, 2, 70, 16
q = torch.randn(B, Hq, 3, D2, generator=g, dtype=torch.float64)  # (B, Hq, Lq, D) three queries
kc, vc = torch.randn(2, B, Hkv, S2, D2, generator=g, dtype=torch.float64)  # (B, Hkv, S, D) each
q_pos = torch.tensor([40, 55, 69])
for page_size in (1, 16):
    k_pages, v_pages, bt = paginate(kc, vc, page_size, g)  # (pages, page_size, Hkv, D) each, (B, pages)
    for n_sink, window in ((0, None), (4, 16), (2, 3)):
        dense = attention(q, kc, vc, q_pos, n_sink, window, impl="torch")
        paged = paged_attention(q, k_pages, v_pages, bt, q_pos, n_sink, window, impl="torch")
        assert torch.allclose(paged, dense, rtol=0, atol=1e-12)
    print(f"pages of {page_size:>2}: paged attention matches contiguous attention for every key set")

# %% [markdown]
# Decoding from paged caches: `prefill_prompt(..., page_size=16)` keeps the target's and the draft's KV
# in `PagedKVCache`s (pages drawn from one pool in a random order), and every run from that prefill
# decodes on a fork of them: the prompt's pages shared, its own tokens in pages of its own (next
# cell). The output is still the target's, token for token:

# %%
target, head = harness_models()
prompt = torch.randint(0, target.config.vocab_size, (30,), generator=g)
dense_out = wmtp.greedy_generate(target, prompt, 24)
pre = prefill_prompt(target, prompt, 30 + 24 + 3, draft=head, page_size=16)
print("target cache:", type(pre.target_cache).__name__, "block table", pre.target_cache.block_table.tolist())
for n_sink, window in ((0, None), (4, 16)):
    out, stats = wmtp.speculative_generate(target, head, prompt, 24, 3, n_sink, window, prefill=pre)
    print(f"key set {n_sink} + {window}: output == dense: {torch.equal(out, dense_out)}")
    assert torch.equal(out, dense_out)

# %% [markdown]
# Each of those runs decoded on a **fork** of the prefill's caches (`PagedKVCache.fork`, NOTE [Forks]
# in `wmtp/pagedcache.py`), as vLLM shares a prompt's blocks among the sequences that continue it.
# The fork's block table keeps the prefill's pages wholly below the prompt's end (shared, never
# written again) and takes pages of its own from the pool's free ones for the positions it writes;
# the page holding the prompt's end is copied first (copy on write). When a run's fork is garbage
# collected (at the end of the run, unless something still holds it) its pages go back to the
# pool. At a million tokens a run adds its new tokens' pages, not a copy of the prompt's:

# %%
P = prompt.numel()
run = pre.target_cache.fork(P, P + 24)  # a run that writes positions P .. P+23
print("the prefill's block table:", pre.target_cache.block_table.tolist())
print("a fork's block table:     ", run.block_table.tolist())
print(f"the fork addresses {run.nbytes} bytes of KV, {run.shared_nbytes} of them in the prompt's shared pages")
assert torch.equal(run.read(0, torch.arange(P))[0], pre.target_cache.read(0, torch.arange(P))[0])
assert run.block_table[0, 0] == pre.target_cache.block_table[0, 0]  # positions 0..15: one page, shared

# %% [markdown]
# A ring buffer (notebook 06) is a paged cache whose pages hold one row each: its slots are the pages,
# and its block table, one entry per position, is the slot formula `wmtp.ring_slot` written out, many
# positions sharing a slot (`wmtp/ringcache.py`). The same paged attention reads it.

# %%
one_row = PagedKVCache(1, 1, 1, 12, D, page_size=1, dtype=torch.float64)  # pages of one row, random order
print("pages of one row, block table:", one_row.block_table.tolist())
ring = head.new_cache(max_len=40, ring=(2, 6, 3))  # 2 sinks, a window of 6, 3 spare slots
print("a ring's block table (position -> slot):", ring.block_table[0, :20].tolist(), "...")
assert ring.block_table[0, :20].tolist() == [wmtp.ring_slot(p, 2, 6, 3) for p in range(20)]

# %% [markdown]
# ## Measure
#
# On the H200, `wmtp bench decode --page-size 16` decodes with paged target and draft caches in the
# CUDA-graph loop. The committed runs, contiguous beside paged (median ms a step):

# %%
ROOT = Path.cwd() if (Path.cwd() / "metrics").is_dir() else Path.cwd().parent  # the repo root, or tutorials/
for tag in ("131k", "1m"):
    runs = [json.loads((ROOT / f"metrics/experiments/bench-decode-h200-{m}-{tag}.json").read_text())
            for m in ("contiguous", "paged")]
    (contiguous,), (paged,) = (r["rows"] for r in runs)
    print(f"\n{contiguous['context']} tokens: dense {contiguous['dense']['tpot_s'] * 1e3:.3f} -> "
          f"{paged['dense']['tpot_s'] * 1e3:.3f} ms a token")
    for label, arm in contiguous["arms"].items():
        if label not in paged["arms"]:
            continue
        other, lossless = paged["arms"][label], arm["lossless"] and paged["arms"][label]["lossless"]
        print(f"{label:>15}: draft {arm['draft_time_per_step_s'] * 1e3:.3f} -> "
              f"{other['draft_time_per_step_s'] * 1e3:.3f}, verify {arm['verify_time_per_step_s'] * 1e3:.3f} -> "
              f"{other['verify_time_per_step_s'] * 1e3:.3f} ms a step, lossless {lossless}")

# %% [markdown]
# Pages cost this small model a few percent a phase at 131072 and at 1048576 tokens
# (`docs/results/gpu-decode.md`): every read goes through the block table. The windowed draft's
# saving over the native one is the same with pages as without.

# %% [markdown]
# ## Discussion
#
# - Pages change where a key lives, not which keys are read: the key set is defined on logical positions
#   (`wmtp/keyset.py`), and the block table only maps them to memory. So the draft's output, and the
#   target's, are the same for every page order.
# - A windowed draft reads `O(n_sink + window)` rows wherever they live; with pages it touches about
#   `(n_sink + window) / page_size` pages, which is what lets a serving engine share one pool among many
#   sequences and still draft cheaply at long context.
# - The course's assignment 07 (`wmtp grade paged`) asks for exactly these addresses.
