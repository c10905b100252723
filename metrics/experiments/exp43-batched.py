"""Experiment 43: batches with a position a row (wmtp/batched.py: every row keeps its own matches)
against lockstep batches (wmtp/lockstep.py: every row keeps the batch's least match), dense batches
and each prompt decoded alone, side by side in one run, on experiment 33's models, prompts and
settings (8 + 64, fixed depth 7, B prompts of P tokens).

Per B and round: each prompt alone (``greedy_generate``, ``speculative_generate``) and the batch
(``batched_greedy_generate``, ``lockstep_generate``, ``batched_speculative_generate``), every output
asserted token-equal to the prompt's dense greedy output alone. A method's time is its wall-clock
seconds for the whole batch, prefill included; the same methods run with one new token give the
prefill's, and ``decode_s`` is the difference. Figures: medians of the rounds, ms of decoding a
token a row (``decode_s / (B * (new - 1))``), speedups (old/new - 1) over the prompts decoded alone
densely, and each speculative method's AL (tokens a row keeps per verify pass).

Usage: python3 metrics/experiments/exp43-batched.py BUNDLE_DIR OUT.json DEVICE DTYPE ROUNDS [B ...]
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
ROUNDS, batches = int(sys.argv[5]), [int(b) for b in sys.argv[6:]] or [1, 2, 4, 8]
P, NEW, K, SINK, WIN = 256, 64, 7, 8, 64
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


def _al_alone(runs):
    return sum(s.committed for _, s in runs) / sum(s.steps for _, s in runs)


def methods(prompts: torch.Tensor, new: int) -> dict:
    """Each method's (seconds, outputs, AL or None) for the batch."""
    def spec_alone():
        runs = [wmtp.speculative_generate(target, head, p, new, K, SINK, WIN) for p in prompts]
        return [o for o, _ in runs], _al_alone(runs) if new > 1 else None

    def lockstep():
        outs, stats = wmtp.lockstep_generate(target, head, prompts, new, K, SINK, WIN)
        return outs, stats.mean_accept_length

    def batched():
        outs, stats = wmtp.batched_speculative_generate(target, head, prompts, new, K, SINK, WIN)
        return outs, stats.mean_accept_length

    runs = {"dense_alone": lambda: ([wmtp.greedy_generate(target, p, new) for p in prompts], None),
            "dense_batch": lambda: (wmtp.batched_greedy_generate(target, prompts, new), None),
            "spec_alone": spec_alone, "lockstep": lockstep, "batched": batched}
    return {name: (lambda t, r: (t, *r))(*timed(fn)) for name, fn in runs.items()}


result = {"experiment": 43, "command": " ".join(["python3", sys.argv[0], "BUNDLE_DIR", "OUT.json", *sys.argv[3:]]),
          "environment": environment(device), "dtype": sys.argv[4], "checkpoint": blob["meta"], "prompt_tokens": P,
          "new_tokens": NEW, "depth": K, "key_set": [SINK, WIN], "rounds": ROUNDS, "rows": []}
for B in batches:
    prompts = blob["prompt"][: B * P].view(B, P).to(device)
    seconds = {}
    for _ in range(ROUNDS):
        full, pre = methods(prompts, NEW), methods(prompts, 1)
        want = full["dense_alone"][1]
        for name, (t, outs, al) in full.items():
            assert all(torch.equal(a, b) for a, b in zip(outs, want)), name
            seconds.setdefault(name, []).append((t, pre[name][0], al))
    row = {"B": B, "methods": {}}
    for name, runs in seconds.items():
        decode = statistics.median(t - p for t, p, _ in runs)
        row["methods"][name] = {"total_s": statistics.median(t for t, _, _ in runs),
                                "prefill_s": statistics.median(p for _, p, _ in runs), "decode_s": decode,
                                "ms_per_token_per_row": decode / (B * (NEW - 1)) * 1e3,
                                "mean_accept_length": runs[0][2]}
    base = row["methods"]["dense_alone"]["decode_s"]
    row["decode_speedup_vs_dense_alone"] = {n: base / m["decode_s"] - 1 for n, m in row["methods"].items()}
    result["rows"].append(row)
    write_json(out, result)
    print(B, {n: round(m["ms_per_token_per_row"], 3) for n, m in row["methods"].items()},
          {n: m["mean_accept_length"] for n, m in row["methods"].items()}, flush=True)
