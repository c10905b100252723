"""Experiment 46: the float32 prefill tile's launch (64 query rows of D 64, NOTE [Chunks] in
wmtp/attention/triton_attention.py), four variants side by side in one run.

After experiment 45 a 16K-token prompt of the small preset spends most of its prefill in the
attention kernel (25 of 33 ms), whose float32 64-row tiles run IEEE FMA dots at 4 warps and, as
compiled offline for sm_90 (scripts/kernel_sm90.py, triton 3.7.1), spill 5492 B. Variants, each
only for float32 tiles of more than 16 rows at D <= 64 (a draft's or verify's 16-row tile keeps its
launch): ``ieee_4w`` (the committed launch), ``ieee_8w`` (8 warps: 24 B spilled offline),
``tf32x3_4w`` and ``tf32x3_8w`` (NOTE [tf32x3] in wmtp/attention/triton_plan.py: 192 / 164 B).

The small preset's target and head (random weights), float32, run ``wmtp.rows.prefill_rows``
with ``impl="triton"`` for B prompts of P tokens; per (P, B) and round every variant runs once
(the order rotating), timed wall-clock after a synchronize, after one untimed warm-up each.
Reported: medians, ms a prompt, each variant's speedup over ``ieee_4w`` (old/new - 1), whether
its first new tokens equal ``ieee_4w``'s and the largest difference of the last hidden states from
``ieee_4w``'s and from a float64 run of the reference attention (``impl="torch"``).

Usage: python3 metrics/experiments/exp46-prefill-tiles.py OUT.json DEVICE ROUNDS [P ...]
"""

import copy
import statistics
import sys
import time

import torch

import wmtp
from wmtp.attention import triton_attention as ta
from wmtp.attention import triton_merge as tm
from wmtp.attention import triton_plan as tp
from wmtp.device import synchronize
from wmtp.metrics import environment, write_json
from wmtp.rows import prefill_rows

out, device, ROUNDS = sys.argv[1], torch.device(sys.argv[2]), int(sys.argv[3])
LENGTHS = [int(p) for p in sys.argv[4:]] or [1024, 16384]
BATCHES = [1, 4, 16]
target, head = wmtp.build_models("small", seed=0)
target64, head64 = copy.deepcopy((target, head))  # one copy of both: the head shares the target's embedding
target64, head64 = target64.to(device, torch.float64).eval(), head64.to(device, torch.float64).eval()
target, head = target.to(device, torch.float32).eval(), head.to(device, torch.float32).eval()
PRECISION, LAUNCH = tp.precision, tp.launch_config
VARIANTS = {"ieee_4w": ("ieee", 4), "ieee_8w": ("ieee", 8), "tf32x3_4w": ("tf32x3", 4), "tf32x3_8w": ("tf32x3", 8)}


def prefill_tile(dtype, block_m, D) -> bool:
    return dtype == torch.float32 and 16 < block_m <= 64 and D <= 64


def use(variant: str) -> None:
    """Plan float32 prefill tiles with the variant's precision and warps; drop every cached plan and launch."""
    precision, warps = VARIANTS[variant]

    def launch_config(B, Hq, Hkv, Lq, D, dtype, *args, **kwargs):
        cfg = LAUNCH(B, Hq, Hkv, Lq, D, dtype, *args, **kwargs)
        return cfg._replace(num_warps=warps) if prefill_tile(dtype, cfg.block_m, D) else cfg

    tp.launch_config = launch_config
    tp.precision = lambda dtype, dev, bm, D: (precision if dev != "cpu" and prefill_tile(dtype, bm, D)
                                              else PRECISION(dtype, dev, bm, D))
    tp._static_plan.cache_clear()
    ta._ATTENTION.kernels.clear()
    tm._MERGE.kernels.clear()


def run(variant, rows, P):
    use(variant)
    with torch.no_grad():
        synchronize(device)
        t0 = time.perf_counter()
        _, _, x, h, _ = prefill_rows(target, head, rows, P, "triton")
        synchronize(device)
        return time.perf_counter() - t0, x, h


gen = torch.Generator().manual_seed(46)
result = {"experiment": 46, "command": " ".join(["python3", sys.argv[0], "OUT.json", *sys.argv[2:]]),
          "environment": environment(device), "preset": "small", "dtype": "float32", "weights": "random (seed 0)",
          "variants": {k: {"precision": p, "num_warps": w} for k, (p, w) in VARIANTS.items()},
          "rounds": ROUNDS, "warmup_rounds": 1, "rows": []}
for P in LENGTHS:
    for B in BATCHES:
        rows = list(torch.randint(0, target.config.vocab_size, (B, P), generator=gen).to(device))
        with torch.no_grad():
            _, _, x64, h64, _ = prefill_rows(target64, head64, rows, P, "torch")
        outs = {v: run(v, rows, P)[1:] for v in VARIANTS}  # warm-up: compiles
        seconds = {v: [] for v in VARIANTS}
        names = list(VARIANTS)
        for r in range(ROUNDS):
            for v in names[r % len(names):] + names[: r % len(names)]:
                seconds[v].append(run(v, rows, P)[0])
        med = {v: statistics.median(s) for v, s in seconds.items()}
        base_x, base_h = outs["ieee_4w"]
        row = {"prompt_tokens": P, "batch": B, "seconds_rounds": seconds,
               "median_ms": {v: t * 1e3 for v, t in med.items()},
               "median_ms_a_prompt": {v: t * 1e3 / B for v, t in med.items()},
               "speedup_over_ieee_4w": {v: med["ieee_4w"] / t - 1 for v, t in med.items()},
               "first_tokens_equal_ieee_4w": {v: bool(torch.equal(x, base_x)) for v, (x, _) in outs.items()},
               "first_tokens_equal_float64": {v: bool(torch.equal(x, x64)) for v, (x, _) in outs.items()},
               "hidden_max_abs_diff_ieee_4w": {v: float((h - base_h).abs().max()) for v, (_, h) in outs.items()},
               "hidden_max_abs_diff_float64": {v: float((h.double() - h64).abs().max()) for v, (_, h) in outs.items()}}
        result["rows"].append(row)
        print(P, B, {v: round(t, 2) for v, t in row["median_ms"].items()},
              {v: f"{s:+.1%}" for v, s in row["speedup_over_ieee_4w"].items()},
              {v: f"{d:.1e}" for v, d in row["hidden_max_abs_diff_float64"].items()}, flush=True)
use("ieee_4w")
write_json(out, result)
