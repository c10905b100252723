"""Experiment 49: the CPU draft-attention bar's ratio (native time / 8 + 64 time at 16384 tokens,
one draft query; reproduce's ``bars.draft_attention_16k_sink8_win64``) measured with the code of
several revisions side by side, rounds alternating, to tell the code's part from the machine's.

Usage: python3 metrics/experiments/exp49-draft-attention-ratio.py OUT.json ROUNDS CHECKOUT [CHECKOUT ...]
(the side-by-side runs: metrics/experiments/revisions.py)

Each CHECKOUT is a directory holding a revision of the repository (``git worktree add DIR REV``);
each round runs ``wmtp.bench.bench_draft_attention`` from every checkout in turn, in a subprocess
with that checkout first on ``sys.path``: the small preset's draft shapes, float64 (reproduce's
decode dtype on a CPU), the native, 64 + 4096 and 8 + 64 key sets, 100 repeats (reproduce's count
for the small preset), seed 42. Reported per run: each key set's median and the ratio.
"""

from __future__ import annotations

import sys
from pathlib import Path

from revisions import alternate, write

RUN = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import wmtp
from wmtp.bench import bench_draft_attention
from wmtp.config import KeySetConfig, get_preset
assert wmtp.__file__.startswith(sys.argv[1]), wmtp.__file__
keysets = (KeySetConfig(0, None), KeySetConfig(64, 4096), KeySetConfig(8, 64))
rows = bench_draft_attention(get_preset("small").model, (16384,), keysets, repeats=100, dtype=torch.float64,
                             device="cpu", seed=42)
print(json.dumps({r["keyset"]: r["median_s"] for r in rows}))
"""


def main(argv: list[str]) -> int:
    out, rounds, checkouts = Path(argv[0]), int(argv[1]), [Path(a).resolve() for a in argv[2:]]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from wmtp.metrics import environment

    def show(m: dict) -> str:
        return (f"native {m['native'] * 1e3:.3f} ms, 8+64 {m['sink8+win64'] * 1e3:.3f} ms, "
                f"ratio {m['native'] / m['sink8+win64']:.1f}")

    runs = alternate(RUN, rounds, checkouts, show)
    for run in runs:
        run["ratio_native_over_sink8_win64"] = run["median_s"]["native"] / run["median_s"]["sink8+win64"]
    write(out, {"experiment": 49, "command": "python3 metrics/experiments/exp49-draft-attention-ratio.py "
                + " ".join(argv), "environment": environment("cpu"), "context": 16384, "dtype": "float64",
                "repeats": 100, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
