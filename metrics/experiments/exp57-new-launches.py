"""Experiment 57 (session 43): the planner's two changes after experiments 55 and 56, old launch against new.

Experiment 55 (short-cutoff-h100-exp55.json) found a draft-extend (2-8 queries) at D128 and D256 past
the short cut-off faster in one stage than in the planned 3-4, at the planned split count; experiment
56 (wave-count-h100-exp56.json) found a short range with heavy partials at 1.5 waves of one-block
programs faster with two blocks a program. Both ran on one H100 at 9927db5's planner (the code of
6a81165). This times, for every cell of the two experiments whose launch the planner now changes,
the launch those runs planned (``old``, read from their JSON) beside the one this code plans
(``new``), in the bench's method (``graph_ms``: a CUDA graph's replay under
``triton.testing.do_bench``, cold L2, median; three rounds, the median of the three), and checks the
two outputs agree (``max_abs_diff``). S = 131072. Rows are written after every cell.

Usage: python3 metrics/experiments/exp57-new-launches.py OUT.json
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
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("short-cutoff-h100-exp55.json", "wave-count-h100-exp56.json")
OUT = sys.argv[1]


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


def changed_cells(sm: int) -> list[tuple]:
    """(Hq, Hkv, D, B, q_len, old launch, new launch) of the cells whose planned launch moved."""
    cells = {}
    for name in SOURCES:
        for r in json.load(open(os.path.join(HERE, name)))["rows"]:
            if r["variant"] == "planned":
                cells[(r["Hq"], r["Hkv"], r["D"], r["B"], r["q_len"])] = r["planned_launch"]
    out = []
    for (Hq, Hkv, D, B, q_len), old in cells.items():
        new = launch_config(B, Hq, Hkv, q_len, D, torch.bfloat16, S, N_SINK, WINDOW, sm)._asdict()
        if new != old:
            out.append((Hq, Hkv, D, B, q_len, old, new))
    return out


t0 = time.perf_counter()
sm = torch.cuda.get_device_properties(0).multi_processor_count
res = {"command": f"python3 metrics/experiments/exp57-new-launches.py {OUT}", "environment": environment(
       torch.device("cuda")), "doc": __doc__, "sm_count": sm, "S": S, "n_sink": N_SINK, "window": WINDOW,
       "unit": "us: graph_ms, median of 3 rounds", "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D, B, q_len, old, new in changed_cells(sm):
    k = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    v = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    q = torch.randn(B, Hq, q_len, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
    q_pos = torch.arange(S - q_len, S, device="cuda")  # (Lq,)
    kw_old = {key: old[key] for key in ("num_splits", "block_n", "num_warps", "num_stages")}
    ref = ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW, **kw_old).float()
    for name, kw in (("old", kw_old), ("new", {})):
        fn = lambda kw=kw, k=k, v=v: ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW, **kw)  # noqa: E731
        row = {"Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "q_len": q_len, "variant": name, "old_launch": old,
               "new_launch": new}
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
    res["wall_time_s"] = time.perf_counter() - t0  # written after every cell: a run cut short keeps its rows
    res["complete"] = False
    with open(OUT + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(OUT + ".tmp", OUT)
res["complete"] = True
with open(OUT + ".tmp", "w") as f:
    json.dump(res, f, indent=2)
os.replace(OUT + ".tmp", OUT)
