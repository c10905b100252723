"""Experiment 54: the windowed draft's launch at batch > 1 (sink 64 + window 4096, bf16).

The batch-4 sweep on an H100 (docs/results/gpu-attention.md, "Batch 4 on an H100") read the draft at
2.2x its batch-1 time at D256 but 2.5x at D128, where SDPA over a ready compact buffer overtook it.
The planner (wmtp/attention/plan.py, NOTE [Launch]) calls a key range "short" when
``cdiv(n_keys, 64) * B * Hkv <= 8 * sm_count`` and then gives each program one block of 64 keys
(``num_splits = n_blk``, one stage); past that it plans whole waves of pipelined splits. At D128
(Hkv 8) batch 4 crosses the line (65 * 4 * 8 = 2080 > 8 * 132), at D256 (Hkv 2) batch 16 does. This
times, in the bench's method (``graph_ms``: the call captured in a CUDA graph, its replay timed by
``triton.testing.do_bench``, cold L2, median; three rounds, the median of the three), for batches 1
to 32, both bench shapes and the small preset's (Hq4/Hkv4/D64), ``q_len`` 1, 4 and 8:
  planned: the launch of the code that runs;
  old:     the launch of 42cd31d's planner (a short range: one block a program, ``num_splits = n_blk``);
  short:   the short range's launch whatever the batch (the planner's own, asked with a huge SM count);
  splits=N: the planned launch with N splits a (batch, kv head).
The first run (42cd31d's planner, batches 1-16, the bench shapes, splits 2-33, an H100) is
batch-launch-h100-exp54.json; the second (0effdd2's planner, which took whole waves of blocks for
every short range, an H200, cut by the device budget before the small shape's batch 32),
batch-launch-h200-exp54.json.
Each variant's output is checked against the planned one's (``max_abs_diff``: splits change the
order of the sums). S = 131072 keys a row (the draft reads the same 4160 keys at any S).

Usage: python3 metrics/experiments/exp54-batch-launch.py OUT.json
"""

import json
import os
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.attention.plan import launch_config
from wmtp.bench_timing import graph_replay_ms
from wmtp.metrics import environment

S, N_SINK, WINDOW, ROUNDS = 1 << 17, 64, 4096, 3
SHAPES = ((16, 2, 256), (32, 8, 128), (4, 4, 64))  # (Hq, Hkv, D): the bench's, the small preset's
BATCHES = (1, 2, 4, 8, 16, 32)
Q_LENS = (1, 4, 8)
SPLITS = (4, 16, 33)


def old_launch(plan, B, Hkv, q_len, sm):
    """42cd31d's planner: a short range (bf16) ran one block a program."""
    n_keys = min(S, N_SINK + WINDOW + q_len - 1)
    short = -(-n_keys // 64) * B * Hkv <= 8 * sm
    return plan._replace(num_splits=-(-n_keys // plan.block_n) + 1) if short else plan


OUT = sys.argv[1]


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


t0 = time.perf_counter()
sm = torch.cuda.get_device_properties(0).multi_processor_count
res = {"command": f"python3 metrics/experiments/exp54-batch-launch.py {OUT}", "environment": environment(
       torch.device("cuda")), "doc": __doc__, "sm_count": sm, "S": S, "n_sink": N_SINK, "window": WINDOW,
       "unit": "us: graph_ms, median of 3 rounds", "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in SHAPES:
    for B in BATCHES:
        k = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
        v = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
        for q_len in Q_LENS:
            q = torch.randn(B, Hq, q_len, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
            q_pos = torch.arange(S - q_len, S, device="cuda")  # (Lq,)
            plan = launch_config(B, Hq, Hkv, q_len, D, torch.bfloat16, S, N_SINK, WINDOW, sm)
            short = launch_config(B, Hq, Hkv, q_len, D, torch.bfloat16, S, N_SINK, WINDOW, 10**6)
            old = old_launch(plan, B, Hkv, q_len, sm)
            variants = {"planned": {}, "old": dict(num_splits=old.num_splits, block_n=old.block_n,
                                                   num_warps=old.num_warps, num_stages=old.num_stages),
                        "short": dict(num_splits=short.num_splits, block_n=short.block_n,
                                      num_warps=short.num_warps, num_stages=short.num_stages)}
            variants.update({f"splits={n}": dict(num_splits=n) for n in SPLITS})
            ref = ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW).float()
            for name, kw in variants.items():
                fn = lambda kw=kw, k=k, v=v: ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW, **kw)  # noqa: E731
                row = {"Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "q_len": q_len, "variant": name, "overrides": kw,
                       "planned_launch": plan._asdict(), "short_launch": short._asdict()}
                try:
                    row["max_abs_diff"] = (fn().float() - ref).abs().max().item()
                    times = [graph_replay_ms(fn, timed) for _ in range(ROUNDS)]
                    row["rounds_us"] = [t * 1e3 if isinstance(t, float) else t for t in times]
                    ok = [t for t in times if isinstance(t, float)]
                    row["us"] = statistics.median(ok) * 1e3 if ok else None
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                res["rows"].append(row)
                print(Hq, Hkv, D, B, q_len, name, row.get("us"), row.get("error", ""), flush=True)
        del k, v
        torch.cuda.empty_cache()
        res["wall_time_s"] = time.perf_counter() - t0  # written after every batch: a run cut short keeps its rows
        with open(OUT + ".tmp", "w") as f:
            json.dump(res, f, indent=2)
        os.replace(OUT + ".tmp", OUT)
