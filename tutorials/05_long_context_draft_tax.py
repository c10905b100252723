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
# # 05 · The long-context draft tax
#
# ## What you will learn
#
# - what the *draft-KV tax* is: a native MTP head reads the whole KV cache for every token it drafts, so
#   its cost grows with the context, while a windowed head reads `n_sink + window` keys at any context;
# - how to measure it: keys read and reference-attention time against context length
#   (`wmtp.bench.bench_draft_attention`);
# - the step-cost equation that decides whether windowing pays: `step = t_verify + t_draft` and
#   `TPOT = step / AL` (`wmtp.metrics.tpot`), and a what-if table of the trade between a cheaper draft
#   and a lower accept length;
# - where the committed results are (`metrics/`), and how to plot them.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

import wmtp
from wmtp.bench import bench_draft_attention
from wmtp.config import KeySetConfig
from wmtp.keyset import key_count
from wmtp.metrics import reduction, speedup, tpot

# the repository root (the folder holding pyproject.toml), whether Jupyter started here or in tutorials/
ROOT = next((p for p in (Path.cwd(), *Path.cwd().parents) if (p / "pyproject.toml").exists()), Path.cwd())
MODEL = wmtp.get_preset("small").model  # the CPU reproduction's shapes: Hq, Hkv, head_dim
KEYSETS = (KeySetConfig(0, None), KeySetConfig(64, 4096), KeySetConfig(8, 64))  # native, paper, small
print(f"draft attention shapes: Hq={MODEL.n_heads}, Hkv={MODEL.n_kv_heads}, head_dim={MODEL.head_dim}")

# %% [markdown]
# ## Naive reference
#
# Count, don't time. One speculative step with depth `K` at context `S` makes `K` draft queries at
# positions `S-1 .. S+K-2`, one for each draft it proposes; each reads `key_count(t, n_sink, window)`
# keys, and each key read moves its key and value vectors (`2 * Hkv * head_dim` numbers per layer) from
# memory. If the draft were pure memory traffic, its time would be proportional to this count. (A real
# step's draft extend also runs one query for each draft the step before accepted, `a + K` queries in
# all, so the measured `draft_keys_read_per_step` of the committed CPU run below is about
# `1 + (AL - 1) / K` times this count.)

# %%
K = 7  # the paper's draft depth
BYTES = 2 * MODEL.n_kv_heads * MODEL.head_dim * 4  # K and V of one key, one layer, float32


def keys_per_step(S: int, ks: KeySetConfig) -> int:
    return sum(key_count(t, ks.n_sink, ks.window) for t in range(S - 1, S - 1 + K))


print(f"{'context':>9} " + " ".join(f"{ks.label:>17}" for ks in KEYSETS) + "   (keys read per step, K = 7)")
for S in (1_024, 4_096, 16_384, 131_072, 1_048_576):
    print(f"{S:>9} " + " ".join(f"{keys_per_step(S, ks):>17,}" for ks in KEYSETS))
S = 1_048_576
print(f"\nat 1M tokens the native draft moves {keys_per_step(S, KEYSETS[0]) * BYTES / 2**30:.1f} GiB per step "
      f"per layer in this model; sink64+win4096 moves {keys_per_step(S, KEYSETS[1]) * BYTES / 2**20:.0f} MiB")

# %% [markdown]
# ## Mechanism
#
# One speculative step costs the draft (`K` head steps) plus one target verify pass, and yields on
# average `AL` tokens (the mean accept length: accepted drafts plus the target's own token). So
#
#     t_step = t_verify + t_draft          TPOT = t_step / AL
#
# Windowed-MTP shrinks `t_draft` at long context; the price it may pay is a smaller `AL` (notebooks 02
# and 03). Two figures, never confused (`docs/concepts.md#speedup-reduction-ratio`): of two times, a
# **speedup** is `old / new - 1` (how much a rate, e.g. tokens per second, grows), a **reduction** is
# `1 - new / old` (how much of a cost, e.g. time per step, is saved).

# %%
t_verify, t_draft, al = 10e-3, 6e-3, 3.2  # seconds, seconds, tokens per step: an example step
print(f"TPOT = ({t_verify * 1e3:.0f} ms + {t_draft * 1e3:.0f} ms) / {al} "
      f"= {tpot(t_verify, t_draft, al) * 1e3:.2f} ms/token")
print(f"draft 6 ms -> 1 ms is a {reduction(6e-3, 1e-3):.0%} reduction of draft time; "
      f"TPOT {tpot(t_verify, 6e-3, al) * 1e3:.2f} -> {tpot(t_verify, 1e-3, al) * 1e3:.2f} ms is a "
      f"{speedup(tpot(t_verify, 6e-3, al), tpot(t_verify, 1e-3, al)):.0%} speedup")

# %% [markdown]
# ## Check
#
# `tpot` is the equation above; a speedup and a reduction of the same pair of times are two views of
# one ratio (`1 + speedup = 1 / (1 - reduction)`); and the keys a step reads in the naive reference are
# what the key-set formula says: `K * (n_sink + window)` once the context `S` reaches `n_sink + window`,
# and `S + (S + 1) + ... + (S + K - 1)` for the native head.

# %%
assert abs(tpot(t_verify, t_draft, al) - (t_verify + t_draft) / al) < 1e-15
for old, new in [(6.0, 1.0), (2.0, 1.5), (1.0, 1.0)]:
    assert abs((1 + speedup(old, new)) - 1 / (1 - reduction(old, new))) < 1e-12
for ks in KEYSETS[1:]:
    S = 100_000
    assert keys_per_step(S, ks) == K * (ks.n_sink + ks.window)
assert keys_per_step(100_000, KEYSETS[0]) == sum(range(100_000, 100_000 + K))
print("step-cost equation, speedup/reduction and key counts check out")

# %% [markdown]
# ## Measure
#
# **Draft attention alone**, timed with the reference implementation on this machine: one draft query
# over a cache of `S` keys, each key set side by side in one run (medians of a few repeats: a laptop
# figure, noisy, for the shape of the curves, not for a paper). A fourth arm, a pure window of 4160 keys,
# reads exactly as many keys as 64 + 4096 once the context passes 4160, but in one contiguous range.

# %%
contexts = (1_024, 2_048, 4_096, 8_192, 16_384)
ARMS = (*KEYSETS, KeySetConfig(0, 4160))  # + a pure window as long as 64 + 4096
rows = bench_draft_attention(MODEL, contexts, ARMS, repeats=25, seed=0)
fig, (ax_keys, ax_time) = plt.subplots(1, 2, figsize=(11, 4))
for ks in ARMS:
    mine = [r for r in rows if r["keyset"] == ks.label]
    style = "o--" if ks is ARMS[-1] else "o-"
    ax_keys.loglog([r["context"] for r in mine], [r["keys_read"] for r in mine], style, label=ks.label)
    ax_time.loglog([r["context"] for r in mine], [r["median_s"] * 1e6 for r in mine], style, label=ks.label)
ax_keys.set_ylabel("keys read per draft query")
ax_time.set_ylabel("median time per draft query (µs)")
for ax in (ax_keys, ax_time):
    ax.set_xlabel("context S (tokens)")
    ax.legend()
ax_time.set_title("reference attention, this CPU")
fig.tight_layout()

for r in rows:
    if r["context"] == max(contexts):
        print(f"S={r['context']}: {r['keyset']:>16} reads {r['keys_read']:>6} keys, {r['median_s'] * 1e6:7.1f} µs, "
              f"native/this = {r['time_ratio_vs_native']:.1f}x")

# %% [markdown]
# **Keys read is not time.** Compare the two arms that read 4160 keys. The reference implementation
# (`wmtp/attention/reference.py`) reads each key range as a view of the cache (no copy of K or V) and
# joins only the ranges' scores: the sink + window arm pays a second matmul per step and that join,
# the pure window neither. At these sizes on a CPU such fixed costs are a visible share of the time;
# compare the two curves on your machine. Keys read is the tax's floor; what an implementation pays
# on top (copies, launches) is why the kernel of notebook 04 reads both ranges in place, in one pass.

# %% [markdown]
# **What-if.** Put the equation to work. Take a native step with `t_verify = 1` (the unit) and a draft
# costing `t_draft` of it, and suppose windowing cuts the draft time to `f = 10 %` of native (long
# context, where the draft's attention dominates). The table gives the **TPOT speedup** of windowed over
# native for each ratio of accept lengths `AL_window / AL_native`; negative means windowing loses. The
# last column is the break-even ratio: windowing pays iff `AL_window / AL_native > (1 + f t_draft) / (1 + t_draft)`.

# %%
F = 0.10
al_ratios = (1.00, 0.95, 0.90, 0.80)
print(f"{'t_draft / t_verify':>19} " + " ".join(f"AL x{r:.2f}" for r in al_ratios) + "   break-even AL ratio")
for draft_share in (0.05, 0.25, 1.0, 4.0):
    native = tpot(1.0, draft_share, 1.0)  # AL_native = 1 unit: only ratios matter
    cells = [speedup(native, tpot(1.0, F * draft_share, r)) for r in al_ratios]
    print(f"{draft_share:>19} " + " ".join(f"{c:>+8.0%}" for c in cells)
          + f"   {(1 + F * draft_share) / (1 + draft_share):>19.2f}")

# %% [markdown]
# At short context the draft is a small share of the step (first row): cutting it gains little, and any
# drop in `AL` loses. At long context, where the native draft costs as much as or more than the verify
# pass, windowing wins even when the window costs a fifth of the accept length.
#
# ### The committed results
#
# `wmtp reproduce` (CPU, see `metrics/README.md` for the exact command) writes
# `metrics/python-stdlib-seed42.json`: per context and per key set, the measured draft and verify time
# per step, `AL` and TPOT, and the draft-attention timings. `wmtp bench attention --device cuda` writes
# `metrics/bench-attention-h200.json`: the Triton kernel and its alternatives on an NVIDIA H200. Each
# plot below is drawn only if its file is in your checkout; a missing file prints one line and is skipped.
# On the GPU, the draft's tax is the gap between `triton_full` (every key) and `triton_window` (the sink +
# window keys, in place): the first grows with the context, the second stays flat.

# %%
cpu_path = ROOT / "metrics" / "python-stdlib-seed42.json"
if not cpu_path.exists():
    print(f"{cpu_path.relative_to(ROOT)} not found (make it with `HF_DATASETS_OFFLINE=1 wmtp reproduce --paper "
          "windowed-mtp --device cpu --seed 42`; offline, so the corpus is python-stdlib): skipping the CPU plots")
else:
    m = json.loads(cpu_path.read_text())
    labels = list(m["contexts"][0]["arms"])
    ctx = [c["context"] for c in m["contexts"]]
    fig, (ax_step, ax_al, ax_attn) = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        arms = [c["arms"][label] for c in m["contexts"]]
        xs = [x + i * width for x in range(len(ctx))]
        draft = [a["draft_time_per_step_s"] * 1e3 for a in arms]
        verify = [a["verify_time_per_step_s"] * 1e3 for a in arms]
        ax_step.bar(xs, verify, width, color=f"C{i}", alpha=0.5)
        ax_step.bar(xs, draft, width, bottom=verify, color=f"C{i}", label=f"{label} (light: verify)")
        ax_al.plot(ctx, [a["mean_accept_length"] for a in arms], "o-", color=f"C{i}", label=label)
        print(f"{label:>16}: TPOT " + ", ".join(f"{c}: {a['tpot_s'] * 1e3:.1f} ms" for c, a in zip(ctx, arms))
              + "; draft keys/step " + ", ".join(f"{a['draft_keys_read_per_step']:.0f}" for a in arms))
    ax_step.set_xticks([x + 0.4 - width / 2 for x in range(len(ctx))], [str(c) for c in ctx])
    ax_step.set_xlabel("context")
    ax_step.set_ylabel("ms per step (verify + draft)")
    ax_step.legend(fontsize=8)
    ax_al.set_xscale("log")
    ax_al.set_xlabel("context")
    ax_al.set_ylabel("mean accept length AL")
    ax_al.legend(fontsize=8)
    for i, label in enumerate(sorted({r["keyset"] for r in m["draft_attention"]})):
        mine = sorted((r for r in m["draft_attention"] if r["keyset"] == label), key=lambda r: r["context"])
        ax_attn.loglog([r["context"] for r in mine], [r["median_s"] * 1e6 for r in mine], "o-", label=label)
    ax_attn.set_xlabel("context")
    ax_attn.set_ylabel("draft attention, median µs")
    ax_attn.legend(fontsize=8)
    fig.suptitle(f"committed CPU run: {cpu_path.name}")
    fig.tight_layout()

# %%
gpu_path = ROOT / "metrics" / "bench-attention-h200.json"
if not gpu_path.exists():
    print(f"{gpu_path.relative_to(ROOT)} not found (make it with `wmtp bench attention --device cuda`): "
          "skipping the GPU plot")
else:
    gpu = json.loads(gpu_path.read_text())

    def device_ms(r):  # the call's kernels captured in a CUDA graph (no Python launcher); else the plain call
        return r.get("graph_ms") or r.get("median_ms")

    shapes = list(dict.fromkeys((r["Hq"], r["Hkv"], r["D"]) for r in gpu["rows"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes):  # one draft query (q_len 1) per call
        pick = [r for r in gpu["rows"] if (r["Hq"], r["Hkv"], r["D"]) == shape and r["q_len"] == 1 and device_ms(r)]
        for method in gpu["methods"]:
            mine = sorted((r for r in pick if r["method"] == method), key=lambda r: r["S"])
            if mine:
                ax.loglog([r["S"] for r in mine], [device_ms(r) for r in mine], "o-", label=method)
        ax.set_xlabel("context S (tokens)")
        ax.set_ylabel("device ms per call (CUDA graph)")
        ax.set_title("H200 {}, Hq={} Hkv={} D={}, q_len 1".format(gpu["dtype"], *shape))
        ax.legend(fontsize=7)
        win = {r["S"]: device_ms(r) for r in pick if r["method"] == "triton_window"}
        full = {r["S"]: device_ms(r) for r in pick if r["method"] == "triton_full"}
        print("Hq{}/Hkv{}/D{}: ".format(*shape) + ", ".join(
            f"S={S}: window {win[S] * 1e3:.1f} us vs full {full[S] * 1e3:.1f} us" for S in sorted(win) if S in full))
    fig.tight_layout()

# %% [markdown]
# **End to end on the GPU.** `wmtp bench decode --device cuda` decodes the reproduction's models with
# every step captured in CUDA graphs (`wmtp.static_speculative_generate`), all runs at a context
# starting from one shared prefill (`wmtp.prefill_prompt`). `metrics/bench-decode-h200-long.json` holds
# its run at 524288 and 1048576 tokens on an H200. Read a row through the step-cost equation: the
# native draft costs `t_draft / t_verify` of the verify pass, windowing keeps a fraction `f` of it, and
# with equal accept lengths the what-if table's formula gives the TPOT speedup the run measured, to
# within the small difference between the two arms' verify times.

# %%
decode_path = ROOT / "metrics" / "bench-decode-h200-long.json"
if not decode_path.exists():
    print(f"{decode_path.relative_to(ROOT)} not found (make it with `wmtp bench decode --device cuda --contexts "
          "524288 1048576`): skipping the GPU decoding rows")
else:
    dec = json.loads(decode_path.read_text())
    for row in (r for r in dec["rows"] if r["loop"] == "graph"):
        print(f"context {row['context']}: dense {row['dense']['tpot_s'] * 1e3:.3f} ms/token")
        for label, a in row["arms"].items():
            print(f"  {label:>15}: draft {a['draft_time_per_step_s'] * 1e3:6.3f} ms/step, verify "
                  f"{a['verify_time_per_step_s'] * 1e3:.3f}, AL {a['mean_accept_length']:.2f}, TPOT "
                  f"{a['tpot_s'] * 1e3:6.3f} ms ({a['tpot_speedup_vs_dense']:+.0%} vs dense)")
        native, window = row["arms"]["native"], row["arms"]["sink64+win4096"]
        share = native["draft_time_per_step_s"] / native["verify_time_per_step_s"]  # t_draft / t_verify
        f = window["draft_time_per_step_s"] / native["draft_time_per_step_s"]
        predicted = speedup(tpot(1.0, share, 1.0), tpot(1.0, f * share, 1.0))  # equal AL: the table's formula
        measured = speedup(native["tpot_s"], window["tpot_s"])
        print(f"  t_draft/t_verify = {share:.2f}, f = {f:.0%}: the formula says {predicted:+.0%}, "
              f"the run {measured:+.0%} (AL {native['mean_accept_length']:.2f} in both arms)")

# %% [markdown]
# ## Discussion
#
# - Keys read is the cleanest measure of the tax: it is exact, device-independent and linear in the
#   context for the native head, flat for a windowed one. Time follows it once the cache is large enough
#   for memory traffic to dominate; below that, fixed costs (launches, the reference's per-range
#   matmuls, the head's MLP and LM head) hide it or even reverse it.
# - The decision is the step-cost equation, not the attention timing alone: a windowed head that reads
#   100x fewer keys still loses if it lowers `AL` more than it shrinks `t_step`. Measure both `AL` and
#   per-step time in the same run, and report TPOT.
# - Losslessness is not part of the trade: every arm of `wmtp reproduce` asserts `torch.equal` with dense
#   greedy decoding before its numbers are kept.
# - What a laptop cannot show: the paper's contexts (up to 1M tokens) and an H200's memory bandwidth. The
#   keys-read table extends to 1M exactly; the timings do not. The committed GPU decoding run does
#   (`docs/results/gpu-decode.md`): at 1048576 tokens the native draft phase takes 19.2 ms a step, a
#   windowed one 1.3 ms.
