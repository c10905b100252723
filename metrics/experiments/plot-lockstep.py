"""The plots of docs/results/lockstep.md, from the committed JSONs: ms of decoding a token a row
against the batch size per method on the CPU (experiment 33) and, given a second path, µs of device
time a token a row in the CUDA-graph loop on the H200, one panel a context (experiment 34).

Usage: python3 metrics/experiments/plot-lockstep.py CPU.png [GPU.png]
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = Path(__file__).parent
run = json.loads((here / "lockstep-cpu-exp33.json").read_text())
batches = [r["B"] for r in run["rows"]]
fig, ax = plt.subplots(figsize=(7, 4))
for name in run["rows"][0]["methods"]:
    ms = [r["methods"][name]["ms_per_token_per_row"] for r in run["rows"]]
    ax.plot(batches, ms, marker="o", label=name, linestyle="--" if "alone" in name else "-")
ax.set_xscale("log", base=2)
ax.set_xticks(batches, [str(b) for b in batches])
ax.set_xlabel("prompts in the batch (B)")
ax.set_ylabel("ms of decoding a token a row")
ax.set_ylim(bottom=0)
ax.set_title(f"Small preset (WikiText-2), {run['dtype']}, 2-core CPU, {run['prompt_tokens']}-token prompts, "
             f"depth {run['depth']}", fontsize=8)
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[1], dpi=120)

if len(sys.argv) > 2:
    gpu = json.loads((here / "lockstep-graph-h200-exp34.json").read_text())
    contexts = sorted({r["context"] for r in gpu["rows"]})
    fig, axes = plt.subplots(1, len(contexts), figsize=(5 * len(contexts), 4), sharey=True)
    for ax, c in zip(axes, contexts):
        rows = [r for r in gpu["rows"] if r["context"] == c]
        bs = [r["B"] for r in rows]
        for name in rows[0]["methods"]:
            ax.plot(bs, [r["methods"][name]["us_per_token_per_row"] for r in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("prompts in the batch (B)")
        ax.set_title(f"{c}-token prompts", fontsize=9)
    axes[0].set_ylabel("µs of device time a token a row")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Small preset (WikiText-2), {gpu['dtype']}, CUDA-graph loop, {gpu['environment']['device_name']}, "
                 f"{gpu['new_tokens']} new tokens, depth {gpu['depth']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
