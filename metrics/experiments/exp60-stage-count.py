"""Experiment 60 (session 46): every stage count (1-4) for the windowed tiles of 64 and 128 rows.

attention/plan.py gives a windowed 2-32-query tile at D >= 128 one stage up to 24 blocks a program,
two over 25-40 and its shared-memory fit (3 or 4) past 40 (NOTE [Launch]). Experiment 59 timed
those rules on tiles of 16-32 rows mostly; at D256 with 8 queries (Hq16/Hkv2: 64 rows, 4 warps,
32-key blocks) two stages beat the planned one at 22 blocks (-12.0 %) and the planned four at 44
(-13.0 %) on an H200. This times every stage count the shared memory holds at the deeper tiles:
D256 with 8 queries (64 rows, the most a D256 tile holds), D128 with 16 queries (64 rows) and 32
(128 rows), at batches whose planned launch loops over 14 to 132 blocks a program, the planned
splits throughout (``stages_N``: the planned launch with N stages; ``planned_launch`` names the
plan's). bf16, sink 64 + window 4096, S = 131072, contiguous caches, the bench's shapes. Timing as
experiment 59: ``graph_ms`` (a CUDA graph's replay under ``triton.testing.do_bench``, cold L2,
median), three rounds with the variants interleaved, the median of the three; each cell checks the
outputs against the planned launch's (``max_abs_diff``). Rows are written after every cell.

The script's first version (1c49588, the H100 run of session 46) also timed D256 with 16 queries,
planned as one 128-row tile; the kernel cuts those queries into two 8-query tiles (``query_chunk``,
as ``plan_call`` does), so its launches were 64-row tiles of 2B tiles at the 128-row plan's splits
(1.4-1.9 waves of programs), not a planned launch. The cells now plan each tile as ``plan_call``
does, with ``tiles`` = B x chunks, and D256 with 16 queries is replaced by more D256 8-query batches.

Usage: python3 metrics/experiments/exp60-stage-count.py OUT.json
"""

import json
import os
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.attention.plan import _cdiv, launch_config, query_chunk
from wmtp.bench_timing import graph_replay_ms
from wmtp.metrics import environment

S, N_SINK, WINDOW, ROUNDS = 1 << 17, 64, 4096, 3
SHAPES = {128: (32, 8), 256: (16, 2)}  # D: (Hq, Hkv)
OUT = sys.argv[1]
KEYS = ("num_splits", "block_n", "num_warps", "num_stages")
CELLS = ([(256, B, 8) for B in (9, 10, 12, 14, 17, 20, 23, 28, 34, 50, 80)]  # (D, B, q_len); loops 19-132 blocks
         + [(128, B, 16) for B in (6, 7, 9, 12, 17)]  # 14-67
         + [(128, B, 32) for B in (3, 4, 5, 6, 9)])  # 14-67


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


def write(res) -> None:
    with open(OUT + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(OUT + ".tmp", OUT)


t0 = time.perf_counter()
props = torch.cuda.get_device_properties(0)
sm = props.multi_processor_count
smem = getattr(props, "shared_memory_per_block_optin", None)
res = {"command": " ".join(["python3 metrics/experiments/exp60-stage-count.py", OUT]),
       "environment": environment(torch.device("cuda")), "doc": __doc__, "sm_count": sm, "smem_optin": smem,
       "S": S, "n_sink": N_SINK, "window": WINDOW, "unit": "us: graph_ms, median of 3 rounds", "complete": False,
       "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for D, B, Lq in CELLS:
    Hq, Hkv = SHAPES[D]
    k = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    v = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    q = torch.randn(B, Hq, Lq, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
    q_pos = torch.arange(S - Lq, S, device="cuda")  # (Lq,)
    call = lambda **kw: ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW, **kw)  # noqa: E731
    Lc = query_chunk(Lq, Hq // Hkv, torch.bfloat16, D)  # a tile's queries
    args = (B * _cdiv(Lq, Lc), Hq, Hkv, Lc, D, torch.bfloat16, S, N_SINK, WINDOW, sm)  # as plan_call calls it
    planned = launch_config(*args)._asdict()
    n_blk = _cdiv(N_SINK + WINDOW + Lc - 1, planned["block_n"]) + 1
    fit = launch_config(*args, num_splits=1).num_stages  # the shared-memory fit (no split: the long branch)
    base = {key: planned[key] for key in KEYS}
    variants = {f"stages_{n}": {**base, "num_stages": n} for n in range(1, max(fit, planned["num_stages"]) + 1)}
    row = {"D": D, "Hq": Hq, "Hkv": Hkv, "B": B, "q_len": Lq, "tiles": args[0], "planned_launch": planned,
           "fit": fit, "loop_blocks": _cdiv(n_blk, planned["num_splits"]),
           "programs": args[0] * Hkv * planned["num_splits"],
           "variants": variants, "rounds_us": {n: [] for n in variants}, "max_abs_diff": {}}
    try:
        ref = call(**base).float()
        for name, kw in variants.items():
            row["max_abs_diff"][name] = (call(**kw).float() - ref).abs().max().item()
        for _ in range(ROUNDS):
            for name, kw in variants.items():
                t = graph_replay_ms(lambda kw=kw: call(**kw), timed)
                row["rounds_us"][name].append(t * 1e3 if isinstance(t, float) else t)
        for name in variants:
            ok = [t for t in row["rounds_us"][name] if isinstance(t, float)]
            row[f"{name}_us"] = statistics.median(ok) if ok else None
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    res["rows"].append(row)
    times = [round(row[f"{n}_us"], 2) if row.get(f"{n}_us") else None for n in variants]
    print(D, B, Lq, row["loop_blocks"], row["programs"], planned["num_stages"], times, row.get("error", ""), flush=True)
    q = k = v = call = None  # free the cell's cache before the next one
    torch.cuda.empty_cache()
    res["wall_time_s"] = time.perf_counter() - t0  # written after every cell: a run cut short keeps its rows
    write(res)
res["complete"] = True
write(res)
