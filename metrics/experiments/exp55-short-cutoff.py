"""Experiment 55 (prepared in session 42, run in session 43): the draft's launch just past the "short" cut-off.

The planner (wmtp/attention/plan.py, NOTE [Launch]) calls a key range short while
``cdiv(n_keys, 64) * B * Hkv <= 8 * sm_count`` and then runs one 64-key block a program in one stage
(unless partials are heavy, 37b0ba2); past it, whole waves of programs of several blocks, 3-4 stages.
Experiment 54 (batch-launch-h100-exp54.json, batch-launch-h200-exp54.json) found the short launch
faster just past the line for one query (H200: D128 Hq32/Hkv8 batch 4, 32.86 against 36.00 us; D64
Hq4/Hkv4 batch 8, 21.82 against 23.78 us; H100: D128 batch 4, 40.48 against 43.84 us) and far slower
with several queries (D64 4 queries batch 8: 32.2 against 26.3 us; D256 one query batch 16: 72.3
against 54.9 us). Its variants changed the split count only; the short launch also changes the stages.
This maps which of the two knobs wins, and where: for each cell past the cut-off (16 and 32 blocks an
SM) it times, in the bench's method (``graph_ms``: a CUDA graph's replay under
``triton.testing.do_bench``, cold L2, median; three rounds, the median of the three):
  planned:        the launch of the code that runs;
  short:          one block a program, one stage (the planner's own short launch, asked with a huge SM count);
  planned-1stage: the planned split count in one stage;
  half-1stage:    two blocks a program (cdiv(n_blk, 2) splits), one stage;
  quarter-1stage: four blocks a program, one stage;
  half-2stage:    two blocks a program, two stages.
Shapes (Hq, Hkv, D): the bench's two, the small preset's (Hq4/Hkv4/D64) and a GQA-4 D64 one; q_len 1, 2,
4 and 8. Each variant's output is checked against the planned one's (``max_abs_diff``). S = 131072
(the draft reads the same 4160 keys at any S). Rows are written after every batch (a cut run keeps them).

Usage: python3 metrics/experiments/exp55-short-cutoff.py OUT.json
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
SHAPES = ((4, 4, 64), (16, 4, 64), (32, 8, 128), (16, 2, 256))  # (Hq, Hkv, D)
Q_LENS = (1, 2, 4, 8)
BLOCKS_PER_SM = (16, 32)  # past the cut-off of 8: the batch is chosen to give these
OUT = sys.argv[1]


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


def variants(plan, short) -> dict[str, dict]:
    n_blk = short.num_splits  # the short launch runs one block a program: its splits are the blocks
    one = dict(block_n=short.block_n, num_warps=short.num_warps, num_stages=1)
    return {"planned": {}, "short": dict(one, num_splits=n_blk),
            "planned-1stage": dict(num_splits=plan.num_splits, block_n=plan.block_n, num_stages=1),
            "half-1stage": dict(one, num_splits=-(-n_blk // 2)), "quarter-1stage": dict(one, num_splits=-(-n_blk // 4)),
            "half-2stage": dict(one, num_splits=-(-n_blk // 2), num_stages=2)}


t0 = time.perf_counter()
sm = torch.cuda.get_device_properties(0).multi_processor_count
res = {"command": f"python3 metrics/experiments/exp55-short-cutoff.py {OUT}", "environment": environment(
       torch.device("cuda")), "doc": __doc__, "sm_count": sm, "S": S, "n_sink": N_SINK, "window": WINDOW,
       "unit": "us: graph_ms, median of 3 rounds", "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in SHAPES:
    for per_sm in BLOCKS_PER_SM:
        B = max(1, per_sm * sm // (66 * Hkv))  # 66 blocks of 64 keys a row: sink 64 + window 4096
        k = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
        v = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
        for q_len in Q_LENS:
            q = torch.randn(B, Hq, q_len, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
            q_pos = torch.arange(S - q_len, S, device="cuda")  # (Lq,)
            plan = launch_config(B, Hq, Hkv, q_len, D, torch.bfloat16, S, N_SINK, WINDOW, sm)
            short = launch_config(B, Hq, Hkv, q_len, D, torch.bfloat16, S, N_SINK, WINDOW, 10**6)
            ref = ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW).float()
            for name, kw in variants(plan, short).items():
                fn = lambda kw=kw, k=k, v=v: ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW, **kw)  # noqa: E731
                row = {"Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "blocks_per_sm": 66 * B * Hkv / sm, "q_len": q_len,
                       "variant": name, "overrides": kw, "planned_launch": plan._asdict(),
                       "short_launch": short._asdict()}
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
        res["complete"] = False
        with open(OUT + ".tmp", "w") as f:
            json.dump(res, f, indent=2)
        os.replace(OUT + ".tmp", OUT)
res["complete"] = True
with open(OUT + ".tmp", "w") as f:
    json.dump(res, f, indent=2)
os.replace(OUT + ".tmp", OUT)
