"""Experiment 56 (session 43): split count for a short draft range just past one wave of programs.

The planner (wmtp/attention/plan.py, NOTE [Launch]) runs a short key range as one 64-key block a
program unless a split's partial is heavy (>= 1/32 of a block's K and V bytes) and the one-block
programs fill two waves or more, counted by floor: ``n_blk * B * Hkv // (per_sm * sm_count)``. Just
past one wave (1 < waves < 2) the floor keeps one block a program, and experiment 54 found that right
in three cells and wrong in one (D256, 4 queries, batch 2: 22.69 us with 33 splits against 27.38 us
with 67, H200). This times, for every short cell of four shapes, 1-8 queries and the batches that put
one-block programs at 1 to 2.6 waves (per_sm resident programs an SM, as the planner counts them):
  planned: the launch of the code that runs;
  one:     one block a program (n_blk splits);
  half:    two blocks a program (cdiv(n_blk, 2) splits);
  third:   three blocks a program (cdiv(n_blk, 3) splits);
all one stage, the short launch's block and warps, in the bench's method (``graph_ms``: a CUDA graph's
replay under ``triton.testing.do_bench``, cold L2, median; three rounds, the median of the three).
A ceil rule (``cdiv`` for the floor) would run ``half`` for 1 < waves <= 2 and ``third`` up to 3.
Each variant's output is checked against the planned one's (``max_abs_diff``). S = 131072. Rows are
written after every batch (a cut run keeps them).

Usage: python3 metrics/experiments/exp56-wave-count.py OUT.json
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
SHAPES = ((16, 2, 256), (4, 4, 64), (16, 4, 64), (32, 8, 128))  # (Hq, Hkv, D)
Q_LENS = (1, 2, 4, 8)
OUT = sys.argv[1]


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


def cells(sm: int):
    """(Hq, Hkv, D, q_len, B, waves) of short launches with one-block programs at 1 to 2.6 waves."""
    for Hq, Hkv, D in SHAPES:
        for q_len in Q_LENS:
            for B in range(1, 9):
                plan = launch_config(B, Hq, Hkv, q_len, D, torch.bfloat16, S, N_SINK, WINDOW, sm)
                short = launch_config(B, Hq, Hkv, q_len, D, torch.bfloat16, S, N_SINK, WINDOW, 10**6)
                per_sm = 2 if plan.block_m * D * 4 <= 32 * 1024 else 1
                waves = short.num_splits * B * Hkv / (per_sm * sm)
                if plan.num_stages == 1 and 1.0 <= waves <= 2.6:
                    yield Hq, Hkv, D, q_len, B, waves, plan, short


t0 = time.perf_counter()
sm = torch.cuda.get_device_properties(0).multi_processor_count
res = {"command": f"python3 metrics/experiments/exp56-wave-count.py {OUT}", "environment": environment(
       torch.device("cuda")), "doc": __doc__, "sm_count": sm, "S": S, "n_sink": N_SINK, "window": WINDOW,
       "unit": "us: graph_ms, median of 3 rounds", "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D, q_len, B, waves, plan, short in cells(sm):
    k = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    v = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    q = torch.randn(B, Hq, q_len, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
    q_pos = torch.arange(S - q_len, S, device="cuda")  # (Lq,)
    ref = ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW).float()
    n_blk = short.num_splits  # the short launch runs one block a program: its splits are the blocks
    one = dict(block_n=short.block_n, num_warps=short.num_warps, num_stages=1)
    variants = {"planned": {}, "one": dict(one, num_splits=n_blk), "half": dict(one, num_splits=-(-n_blk // 2)),
                "third": dict(one, num_splits=-(-n_blk // 3))}
    for name, kw in variants.items():
        fn = lambda kw=kw, k=k, v=v: ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW, **kw)  # noqa: E731
        row = {"Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "q_len": q_len, "waves": waves, "variant": name,
               "overrides": kw, "planned_launch": plan._asdict(), "short_launch": short._asdict()}
        try:
            row["max_abs_diff"] = (fn().float() - ref).abs().max().item()
            times = [graph_replay_ms(fn, timed) for _ in range(ROUNDS)]
            row["rounds_us"] = [t * 1e3 if isinstance(t, float) else t for t in times]
            ok = [t for t in times if isinstance(t, float)]
            row["us"] = statistics.median(ok) * 1e3 if ok else None
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        res["rows"].append(row)
        print(Hq, Hkv, D, B, q_len, f"{waves:.2f}", name, row.get("us"), row.get("error", ""), flush=True)
    del k, v
    torch.cuda.empty_cache()
    res["wall_time_s"] = time.perf_counter() - t0  # written after every cell: a run cut short keeps its rows
    res["complete"] = False
    with open(OUT + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(OUT + ".tmp", OUT)
res["complete"] = True
with open(OUT + ".tmp", "w") as f:
    json.dump(res, f, indent=2)
os.replace(OUT + ".tmp", OUT)
