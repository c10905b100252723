"""The plot of docs/results/lockstep.md: ms of decoding a token a row against the batch size, per
method, from experiment 33's committed JSON.

Usage: python3 metrics/experiments/plot-lockstep.py OUT.png
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

run = json.loads((Path(__file__).parent / "lockstep-cpu-exp33.json").read_text())
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
