"""Experiment 44: batches with a position a row in the CUDA-graph loop on the H200
(wmtp/static_batched.py: every row keeps its own matches), side by side with lockstep batches
(wmtp/static_lockstep.py: every row keeps the batch's least match) and the dense batch: what
experiment 43 measured on the CPU, and experiment 34's settings and figures.

The models and the text are experiment 22's bundle (the small preset trained on WikiText-2, float32),
row b of a batch of B the P tokens starting ``b * stride`` into its prompt (experiment 34's ``batch``).
Per (P, B) and round: the dense batch (``static_batched_greedy_generate``), lockstep and own positions
with 8 + 64 at fixed depth 7, each with its own prefill, ``NEW`` new tokens a row. Every output is
compared token for token with the dense batch's of the same round (float32 batched passes of other
shapes: a near-tie may differ; the JSON records each row's first differing token, none expected).

Time: the graphs' device seconds (the draft and verify spans), prefill and capture excluded. Figures,
medians of the rounds: µs of device time per token per row (seconds over ``B`` times the tokens each
row kept), AL, and speedups (old/new - 1) over the dense batch of the same B.

Usage: python3 metrics/experiments/exp44-batched-graph.py BUNDLE_DIR OUT.json ROUNDS CONTEXT:B,B,... [...]
"""

import statistics
import sys
from pathlib import Path

import torch

import wmtp
from wmtp.bench_common import with_capacity
from wmtp.metrics import environment, write_json

NEW, K = 128, 7
bundle_dir, out, ROUNDS = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = [(int(c), [int(b) for b in bs.split(",")]) for c, bs in (a.split(":") for a in sys.argv[4:])]
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: a smoke test only
blob = torch.load(Path(bundle_dir) / "bundle.pt", weights_only=True)
text = blob["prompt"].to(dev)
target, head = wmtp.build_models("small", seed=0)
target.load_state_dict(blob["target"])
head.load_state_dict(blob["head"])
target, head = with_capacity(target.to(dev).float(), head.to(dev).float(), max(c for c, _ in plan) + NEW + 2 * K + 2)


def batch(P: int, B: int) -> torch.Tensor:
    stride = P if B == 1 else min(P, (text.numel() - P) // (B - 1))
    return torch.stack([text[b * stride: b * stride + P] for b in range(B)])  # (B, P)


def methods(prompts: torch.Tensor) -> dict:
    """Each method's (outputs, device seconds, AL or None)."""
    times: list[float] = []
    dense = wmtp.static_batched_greedy_generate(target, prompts, NEW, step_times=times)
    got = {"dense_batch": (dense, sum(times), None)}
    outs, stats = wmtp.static_lockstep_generate(target, head, prompts, NEW, K, 8, 64)
    got["lockstep/sink8+win64"] = (outs, sum(stats.draft_times_s) + sum(stats.verify_times_s), stats.mean_accept_length)
    outs, stats = wmtp.static_batched_speculative_generate(target, head, list(prompts), NEW, K, 8, 64)
    got["own_positions/sink8+win64"] = (outs, sum(stats.draft_times_s) + sum(stats.verify_times_s),
                                        stats.mean_accept_length)
    return got


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else None if len(a) == len(b) else n


result = {"experiment": 44, "command": " ".join(["python3", sys.argv[0], "BUNDLE_DIR", "OUT.json", *sys.argv[3:]]),
          "environment": environment(dev), "dtype": "float32", "loop": "graph", "checkpoint": blob["meta"],
          "new_tokens": NEW, "depth": K, "rounds": ROUNDS, "rows": []}
for P, batches in plan:
    for B in batches:
        prompts = batch(P, B)
        runs: dict[str, list] = {}
        for _ in range(ROUNDS):
            got = methods(prompts)
            want = got["dense_batch"][0]
            for name, (outs, seconds, al) in got.items():
                runs.setdefault(name, []).append((seconds, al, [first_difference(o, w) for o, w in zip(outs, want)]))
        row = {"context": P, "B": B, "methods": {}}
        for name, rs in runs.items():
            seconds = statistics.median(s for s, _, _ in rs)
            row["methods"][name] = {"device_s": seconds, "us_per_token_per_row": seconds / (B * (NEW - 1)) * 1e6,
                                    "mean_accept_length": rs[0][1], "device_s_rounds": [s for s, _, _ in rs],
                                    "first_difference_by_round": [d for *_, d in rs]}
        base = row["methods"]["dense_batch"]["us_per_token_per_row"]
        row["speedup_vs_dense_batch"] = {n: base / m["us_per_token_per_row"] - 1 for n, m in row["methods"].items()}
        result["rows"].append(row)
        write_json(out, result)
        print(P, B, {n: (round(m["us_per_token_per_row"], 1), m["mean_accept_length"])
                     for n, m in row["methods"].items()}, flush=True)
