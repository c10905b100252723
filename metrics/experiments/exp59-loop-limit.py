"""Experiment 59 (session 45): the one-stage rule's loop limit on an H200, 23 to 34 blocks a program.

attention/plan.py runs a windowed tile of 2-32 queries at D >= 128 in one stage when its programs loop
over at most 40 key blocks (NOTE [Launch]); the limit was drawn from H100 runs (experiments 55-58).
Experiments 57 and 58 on an H200 (session 45) found the one stage faster at loops of 17 and 23 blocks
but mixed at 33-34: slower at D128 batch 12 (4.7-10.9 %) and D256 batch 32 with 2 and 4 queries
(2.0 / 5.8 %), faster at D128 batch 16 (4.0-5.9 %) and D256 batch 16 with 8 queries (11.2 %). This
times a sample of the batches whose planned launch loops over 23-34 blocks in one stage:
the planned launch (``planned``), the stages of the no-rule branch at the same splits (``old``: 3 or
4) and two stages (``two_stage``). bf16, sink 64 + window 4096, S = 131072, Hq32/Hkv8 at D128 and
Hq16/Hkv2 at D256 (the bench's shapes), contiguous caches. Timing is the bench's ``graph_ms`` (a
CUDA graph's replay under ``triton.testing.do_bench``, cold L2, median); three rounds, the variants
interleaved in each, the median of the three; each cell checks the outputs agree (``max_abs_diff``
against ``old``). Rows are written after every cell.

Groups (``mid`` by default): ``mid``, the cells above; ``short``, loops of 9-22 blocks (D128 with 2, 8
and 16 queries, D256 with 2, 4 and 8) and D128's 16-query tiles at 34; ``long``, loops of 44-67 blocks
(past the limit: ``planned`` is ``old`` there, so it times two stages against the planned 3-4);
``paged``, four cells of ``mid`` in the bench's 16-row pages (one stage runs PAGED=1, more PAGED=2,
NOTE [Pages]); ``moved``, the launches of experiments 57 and 58 that 86230b5 moved to two stages
untimed (D256 batch 16 with 5-8 queries, batch 32 with 2 and 4; D256 windowed prefills of 96 and 128
queries at batch 1, planned by 8-query chunks as ``plan_call`` does). From 86230b5 on, the planner gives
25-40 blocks two stages: ``planned`` is then ``two_stage`` there (each row's ``planned_launch`` says
which), and a ``one_stage`` variant is timed beside it wherever the planned launch has more stages.
``depth`` and ``paged_depth`` (session 46): launches 4c7c62f moves by tile depth (D256 64-row tiles at
19-44 blocks to two stages, D128 64-128-row tiles at 25-40 to one), contiguous and in pages.

Usage: python3 metrics/experiments/exp59-loop-limit.py OUT.json [GROUP ...]
"""

import json
import os
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.attention.paged import paginate
from wmtp.attention.plan import _cdiv, launch_config, query_chunk
from wmtp.bench_methods import PAGE_SIZE
from wmtp.bench_timing import graph_replay_ms
from wmtp.metrics import environment

S, N_SINK, WINDOW, ROUNDS = 1 << 17, 64, 4096, 3
SHAPES = {128: (32, 8), 256: (16, 2)}  # D: (Hq, Hkv)
OUT, GROUP_NAMES = sys.argv[1], sys.argv[2:] or ["mid"]
KEYS = ("num_splits", "block_n", "num_warps", "num_stages")
GROUPS = {  # (D, B, q_len)
    "mid": ([(128, B, q) for q in (2, 8) for B in (10, 11, 12, 13, 14, 15, 16)]
            + [(256, B, q) for q in (2, 4) for B in (23, 26, 27, 29, 31, 33)]
            + [(256, B, 8) for B in (12, 13, 14, 15)]),
    "short": ([(128, B, q) for q in (2, 8, 16) for B in (4, 8)] + [(128, B, 16) for B in (12, 16)]
              + [(256, 12, 2), (256, 20, 2), (256, 16, 4), (256, 10, 8)]),
    "long": [(128, 17, 2), (128, 24, 8), (256, 34, 2), (256, 40, 4), (256, 17, 8), (256, 24, 8)],
    "paged": [(128, 12, 8), (128, 16, 8), (256, 27, 4), (256, 33, 4)],
    "moved": [(256, 16, q) for q in (5, 6, 7, 8)] + [(256, 32, 2), (256, 32, 4), (256, 1, 96), (256, 1, 128)],
    "depth": [(256, 10, 8), (256, 20, 8), (256, 9, 5), (128, 12, 16), (128, 16, 9), (128, 6, 32)],
    "paged_depth": [(256, 10, 8), (256, 20, 8), (128, 12, 16), (128, 6, 32)],
}
CELLS = [(name, *cell) for name in GROUP_NAMES for cell in GROUPS[name]]


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


def write(res) -> None:
    with open(OUT + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(OUT + ".tmp", OUT)


t0 = time.perf_counter()
sm = torch.cuda.get_device_properties(0).multi_processor_count
res = {"command": " ".join(["python3 metrics/experiments/exp59-loop-limit.py", OUT, *sys.argv[2:]]),
       "environment": environment(torch.device("cuda")), "doc": __doc__, "sm_count": sm, "S": S,
       "n_sink": N_SINK, "window": WINDOW, "unit": "us: graph_ms, median of 3 rounds", "complete": False, "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for group, D, B, Lq in CELLS:
    Hq, Hkv = SHAPES[D]
    k = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    v = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    q = torch.randn(B, Hq, Lq, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
    q_pos = torch.arange(S - Lq, S, device="cuda")  # (Lq,)
    if group.startswith("paged"):
        k_pages, v_pages, table = paginate(k, v, PAGE_SIZE, gen)  # (pages, PAGE_SIZE, Hkv, D) x2, (B, pages)
        del k, v
        call = lambda **kw: ta.paged_attention_triton(q, k_pages, v_pages, table, q_pos, N_SINK, WINDOW, **kw)  # noqa: E731
    else:
        call = lambda **kw: ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW, **kw)  # noqa: E731
    Lc = query_chunk(Lq, Hq // Hkv, torch.bfloat16, D)  # a tile's queries: Lq but for the prefills
    args = (B * _cdiv(Lq, Lc), Hq, Hkv, Lc, D, torch.bfloat16, S, N_SINK, WINDOW, sm)  # as plan_call calls it
    planned = launch_config(*args)._asdict()
    n_blk = _cdiv(N_SINK + WINDOW + Lc - 1, planned["block_n"]) + 1
    variants = {"planned": {key: planned[key] for key in KEYS}}
    variants["old"] = {**variants["planned"], "num_stages": launch_config(*args, num_splits=1).num_stages}
    variants["two_stage"] = {**variants["planned"], "num_stages": 2}
    if planned["num_stages"] != 1:
        variants["one_stage"] = {**variants["planned"], "num_stages": 1}
    row = {"group": group, "Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "q_len": Lq, "planned_launch": planned,
           "loop_blocks": _cdiv(n_blk, planned["num_splits"]), "programs": args[0] * Hkv * planned["num_splits"],
           "variants": variants, "rounds_us": {n: [] for n in variants}, "max_abs_diff": {}}
    try:
        ref = call(**variants["old"]).float()
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
    print(group, D, B, Lq, row["loop_blocks"], row["programs"], [row.get(f"{n}_us") for n in variants],
          row.get("error", ""), flush=True)
    q = k = v = k_pages = v_pages = call = None  # free the cell's cache before the next one
    torch.cuda.empty_cache()
    res["wall_time_s"] = time.perf_counter() - t0  # written after every cell: a run cut short keeps its rows
    write(res)
res["complete"] = True
write(res)
