"""The plot of docs/results/step-anatomy.md: a CUDA-graph decode call's replay time and kernel count,
before (experiment 17) and after (experiment 27) few-row products, the norm kernel and the RoPE
kernel. Reads the two committed JSON files only.

Usage: python3 metrics/experiments/plot-step-anatomy.py OUT.png
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
CASES = {"dense_step": "dense step\n(1 row)", "verify_phase_target": "verify pass\n(8 rows)",
         "head_extend_8rows_sink8win64": "head call\n(8 rows, 8+64)",
         "head_1row_sink8win64": "head call\n(1 row, 8+64)"}
runs = {"experiment 17 (6b7e299)": json.loads((HERE / "decode-profile-h200-exp17.json").read_text()),
        "experiment 27 (aa4da14)": json.loads((HERE / "kernel-census-h200-exp27.json").read_text())}
fig, ax = plt.subplots(figsize=(8, 4))
width = 0.38
for i, (label, run) in enumerate(runs.items()):
    xs = [j + (i - 0.5) * width for j in range(len(CASES))]
    us = [run["cases"][c]["replay_us"] for c in CASES]
    bars = ax.bar(xs, us, width, label=label)
    for bar, c in zip(bars, CASES):
        ax.annotate(f"{run['cases'][c]['kernels_per_replay']:.0f} kernels", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=7)
ax.set_xticks(range(len(CASES)), list(CASES.values()), fontsize=8)
ax.set_ylabel("µs a graph replay")
ax.set_title("Small preset, float32, 16K context, NVIDIA H200", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[1], dpi=120)
