"""Experiment 34: lockstep batches in the CUDA-graph loop on the H200 (wmtp/static_lockstep.py), side
by side with the dense batch: what experiment 33 measured on the CPU, where the eager loop is not
bound by the host's launches as it is on a GPU.

The models and the text are experiment 22's bundle (the small preset trained on WikiText-2, float32;
see metrics/experiments/exp22-gate.py ``bundle``): for a context of P tokens, row b of a batch of B is
the P tokens starting ``b * stride`` into the bundle's prompt (``stride = min(P, (len - P) // (B - 1))``:
disjoint where the text allows). Per (P, B) and round: the dense batch (``static_batched_greedy_generate``),
lockstep with 8 + 64 at fixed depth 7, with ``AdaptiveDepth(7)``, and the native draft at fixed
depth 7 (``static_lockstep_generate``), each with its own prefill, ``NEW`` new tokens a row. Every
lockstep output is compared token for token with the dense batch's of the same round (both float32
batched passes of other shapes: a near-tie may differ, lockstep.py NOTE [Batch exactness]; the JSON
records each row's first differing token, none expected).

Time: the graphs' device seconds (``step_times``; the draft and verify spans), prefill and capture
excluded. Figures, medians of the rounds: ms a step, µs of device time per token per row (seconds over
``B`` times the tokens each row kept), the batch's tokens a second, and speedups (old/new - 1) over
the dense batch of the same B and over dense decoding of one row (B = 1).

Usage: python3 metrics/experiments/exp34-lockstep-graph.py BUNDLE_DIR OUT.json CONTEXT:B,B,... [...]
"""

import statistics
import sys
from pathlib import Path

import torch

import wmtp
from wmtp.bench_common import with_capacity
from wmtp.metrics import environment, write_json

NEW, K, ROUNDS = 128, 7, 3
bundle_dir, out = sys.argv[1], sys.argv[2]
plan = [(int(c), [int(b) for b in bs.split(",")]) for c, bs in (a.split(":") for a in sys.argv[3:])]
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: a smoke test only
blob = torch.load(Path(bundle_dir) / "bundle.pt", weights_only=True)
text = blob["prompt"].to(dev)
target, head = wmtp.build_models("small", seed=0)
target.load_state_dict(blob["target"])
head.load_state_dict(blob["head"])
target, head = with_capacity(target.to(dev).float(), head.to(dev).float(), max(c for c, _ in plan) + NEW + K + 1)


def batch(P: int, B: int) -> torch.Tensor:
    stride = P if B == 1 else min(P, (text.numel() - P) // (B - 1))
    return torch.stack([text[b * stride: b * stride + P] for b in range(B)])  # (B, P)


def methods(prompts: torch.Tensor) -> dict:
    """Each method's (outputs, device seconds, tokens each row kept, lockstep stats or None)."""
    times: list[float] = []
    dense = wmtp.static_batched_greedy_generate(target, prompts, NEW, step_times=times)
    got = {"dense_batch": (dense, sum(times), NEW - 1, None)}
    arms = {"lockstep/sink8+win64": (K, 8, 64), "lockstep-adaptive/sink8+win64": (wmtp.AdaptiveDepth(K), 8, 64),
            "lockstep/native": (K, None, None)}
    for name, (depth, n_sink, window) in arms.items():
        outs, stats = wmtp.static_lockstep_generate(target, head, prompts, NEW, depth, n_sink, window)
        got[name] = (outs, sum(stats.draft_times_s) + sum(stats.verify_times_s), stats.committed, stats)
    return got


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first index where two outputs differ (None: equal)."""
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    return int(diff[0]) if diff.numel() else None if len(a) == len(b) else n


result = {"experiment": 34, "command": " ".join(["python3", sys.argv[0], "BUNDLE_DIR", "OUT.json", *sys.argv[3:]]),
          "environment": environment(dev), "dtype": "float32", "loop": "graph", "checkpoint": blob["meta"],
          "new_tokens": NEW, "depth": K, "rounds": ROUNDS, "rows": []}
for P, batches in plan:
    for B in batches:
        prompts = batch(P, B)
        runs: dict[str, list] = {}
        for _ in range(ROUNDS):
            got = methods(prompts)
            want = got["dense_batch"][0]
            for name, (outs, seconds, kept, stats) in got.items():
                diffs = [first_difference(o, w) for o, w in zip(outs, want)]
                runs.setdefault(name, []).append((seconds, kept, stats, diffs))
        row = {"context": P, "B": B, "methods": {}}
        for name, rs in runs.items():
            seconds = statistics.median(s for s, _, _, _ in rs)
            kept, stats = rs[0][1], rs[0][2]
            m = {"device_s": seconds, "tokens_kept_per_row": kept,
                 "us_per_token_per_row": seconds / (B * kept) * 1e6, "batch_tokens_per_s": B * kept / seconds,
                 "device_s_rounds": [s for s, _, _, _ in rs], "first_difference_by_round": [d for *_, d in rs]}
            if stats is not None:
                m |= {"steps": stats.steps, "ms_per_step": seconds / stats.steps * 1e3,
                      "mean_accept_length": stats.mean_accept_length,
                      "lockstep_efficiency": stats.lockstep_efficiency, "steps_by_depth": stats.steps_by_depth}
            else:
                m |= {"steps": NEW - 1, "ms_per_step": seconds / (NEW - 1) * 1e3}
            row["methods"][name] = m
        base = row["methods"]["dense_batch"]["us_per_token_per_row"]
        row["speedup_vs_dense_batch"] = {n: base / m["us_per_token_per_row"] - 1 for n, m in row["methods"].items()}
        result["rows"].append(row)
        one = next((r for r in result["rows"] if r["context"] == P and r["B"] == 1), None)
        if one is not None:
            alone = one["methods"]["dense_batch"]["us_per_token_per_row"]
            row["speedup_vs_dense_one_row"] = {n: alone / m["us_per_token_per_row"] - 1
                                               for n, m in row["methods"].items()}
        write_json(out, result)
        print(P, B, {n: (round(m["us_per_token_per_row"], 1), round(m.get("mean_accept_length", 1), 2))
                     for n, m in row["methods"].items()}, flush=True)
