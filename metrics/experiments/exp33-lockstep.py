"""Experiment 33: lockstep batches (wmtp/lockstep.py) against decoding each prompt alone, side by
side in one run: dense greedy and speculative (fixed depth 7; the native draft and 8 + 64), and
lockstep with 8 + 64 and ``AdaptiveDepth(7)`` (wmtp/policy.py, told each step's least match), for
batches of B prompts of P tokens.

The models and the text are experiment 22's bundle (the small preset trained on WikiText-2; see
metrics/experiments/exp22-gate.py ``bundle``): B disjoint slices of its prompt. Per B and round:
each prompt alone (``greedy_generate``, ``speculative_generate``, one after another) and the batch
(``batched_greedy_generate``, ``lockstep_generate``), every speculative and batched output asserted
token-equal to the prompt's dense greedy output alone. A method's time is its wall-clock seconds for
the whole batch, prefill included; the same methods run with one new token give the prefill's, and
``decode_s`` is the difference. Figures: medians of the rounds, ms of decoding a token a row
(``decode_s / (B * (new - 1))``), and speedups (old/new - 1) over the prompts decoded alone, densely.

Usage: python3 metrics/experiments/exp33-lockstep.py BUNDLE_DIR OUT.json DEVICE DTYPE [B ...]
"""

import statistics
import sys
import time
from pathlib import Path

import torch

import wmtp
from wmtp.device import synchronize
from wmtp.metrics import environment, write_json

bundle_dir, out, device, dtype = sys.argv[1], sys.argv[2], torch.device(sys.argv[3]), getattr(torch, sys.argv[4])
batches = [int(b) for b in sys.argv[5:]] or [1, 2, 4, 8]
P, NEW, K, ROUNDS = 256, 64, 7, 3
ARMS = {"native": (None, None), "sink8+win64": (8, 64)}
blob = torch.load(Path(bundle_dir) / "bundle.pt", weights_only=True)
target, head = wmtp.build_models("small", seed=0)
target.load_state_dict(blob["target"])
head.load_state_dict(blob["head"])
target, head = target.to(device, dtype), head.to(device, dtype)


def timed(fn):
    synchronize(device)
    t0 = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - t0, result


def methods(prompts: torch.Tensor, new: int) -> dict:
    """Each method's (seconds, outputs, lockstep stats or None) for the batch."""
    runs = {"dense_alone": lambda: ([wmtp.greedy_generate(target, p, new) for p in prompts], None),
            "dense_batch": lambda: (wmtp.batched_greedy_generate(target, prompts, new), None)}
    for arm, (n_sink, window) in ARMS.items():
        runs[f"spec_alone/{arm}"] = lambda s=n_sink, w=window: (
            [wmtp.speculative_generate(target, head, p, new, K, s, w)[0] for p in prompts], None)
        runs[f"lockstep/{arm}"] = lambda s=n_sink, w=window: wmtp.lockstep_generate(target, head, prompts, new, K, s, w)
    runs["lockstep-adaptive/sink8+win64"] = lambda: wmtp.lockstep_generate(target, head, prompts, new,
                                                                           wmtp.AdaptiveDepth(K), 8, 64)
    return {name: (lambda t, r: (t, *r))(*timed(fn)) for name, fn in runs.items()}


result = {"experiment": 33, "command": " ".join(["python3", sys.argv[0], "BUNDLE_DIR", "OUT.json", *sys.argv[3:]]),
          "environment": environment(device), "dtype": sys.argv[4], "checkpoint": blob["meta"], "prompt_tokens": P,
          "new_tokens": NEW, "depth": K, "rounds": ROUNDS, "rows": []}
for B in batches:
    prompts = blob["prompt"][: B * P].view(B, P).to(device)
    seconds = {}
    for _ in range(ROUNDS):
        full, pre = methods(prompts, NEW), methods(prompts, 1)
        want = full["dense_alone"][1]
        for name, (t, outs, stats) in full.items():
            assert all(torch.equal(a, b) for a, b in zip(outs, want)), name
            seconds.setdefault(name, []).append((t, pre[name][0], stats))
    row = {"B": B, "methods": {}}
    for name, runs in seconds.items():
        decode = statistics.median(t - p for t, p, _ in runs)
        row["methods"][name] = {"total_s": statistics.median(t for t, _, _ in runs),
                                "prefill_s": statistics.median(p for _, p, _ in runs), "decode_s": decode,
                                "ms_per_token_per_row": decode / (B * (NEW - 1)) * 1e3}
        stats = runs[0][2]
        if stats is not None:
            row["methods"][name] |= {"mean_accept_length": stats.mean_accept_length, "steps": stats.steps,
                                     "lockstep_efficiency": stats.lockstep_efficiency,
                                     "steps_by_depth": stats.steps_by_depth}
    base = row["methods"]["dense_alone"]["decode_s"]
    row["decode_speedup_vs_dense_alone"] = {n: base / m["decode_s"] - 1 for n, m in row["methods"].items()}
    result["rows"].append(row)
    write_json(out, result)
    print(B, {n: round(m["ms_per_token_per_row"], 3) for n, m in row["methods"].items()},
          {n: round(s, 2) for n, s in row["decode_speedup_vs_dense_alone"].items()}, flush=True)
