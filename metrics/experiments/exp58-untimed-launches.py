"""Experiment 58 (session 44): the launches session 43's planner rules moved that no run had timed.

8c97fa7 and 9b74ab9 (attention/plan.py, NOTE [Launch]) run a windowed tile of 2-8 queries at
D >= 128 in one stage when its programs loop over at most 40 key blocks, and count 1.5-1.99 waves of
one-block programs as two. Experiments 55-57 timed the cells they were drawn from; a review listed
what they reach untimed. Each cell here times the planned launch (``planned``) beside the launch
the old rules gave (``old``: the stages of the no-rule branch, or the one-wave split count), or,
for tiles the rule leaves alone (16 queries a tile, a D128 prefill's 32-query chunks), beside one
stage (``one_stage``: would the rule gain there?). Groups:

- verify16k: batch 1, 16K keys, D256, one query, full causal set (256 -> 128 splits);
- paged: the paged draft-extend (PAGED=1 in one stage), D128, batch 4 and 8, 2/4/8 queries;
- loops: D128 draft-extends looping over 23 and 34 blocks (batch 9, 12, 16; 2/4/8 queries);
- tiles: 3, 5, 6, 7 queries (D128 batch 4; D256 batch 16);
- prefill: a D256 windowed prefill whose 8-query chunks take the one stage (96 and 128 queries);
- kept: 16-query tiles and a D128 prefill's 32-query chunks, planned (stages) against one stage.

bf16, sink 64 + window 4096 (none for verify16k), S = 131072 but verify16k, Hq32/Hkv8 at D128 and
Hq16/Hkv2 at D256 (the bench's shapes), paged caches in the bench's 16-row pages. Timing is the
bench's ``graph_ms`` (a CUDA graph's replay under ``triton.testing.do_bench``, cold L2, median);
three rounds, the two variants interleaved in each, the median of the three; each cell also checks
the two outputs agree (``max_abs_diff``). Rows are written after every cell.

Ran in session 44 on an H100 (untimed-launches-h100-exp58.json beside it), before 4f3d1f0 widened the
rule to 2-32 queries a tile; from 4f3d1f0 on, the ``kept`` cells' planned launch is their ``one_stage``.

Usage: python3 metrics/experiments/exp58-untimed-launches.py OUT.json
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
from wmtp.attention.plan import launch_config, query_chunk
from wmtp.bench_methods import PAGE_SIZE
from wmtp.bench_timing import graph_replay_ms
from wmtp.metrics import environment

S, N_SINK, WINDOW, ROUNDS = 1 << 17, 64, 4096, 3
SHAPES = {128: (32, 8), 256: (16, 2)}  # D: (Hq, Hkv)
OUT = sys.argv[1]
KEYS = ("num_splits", "block_n", "num_warps", "num_stages")


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


def cells() -> list[tuple]:
    """(group, D, B, Lq, S, windowed, paged, alternative variant's name)."""
    out = [("verify16k", 256, 1, 1, 1 << 14, False, False, "old")]
    out += [("paged", 128, B, q, S, True, True, "old") for B in (4, 8) for q in (2, 4, 8)]
    out += [("loops", 128, B, q, S, True, False, "old") for B in (9, 12, 16) for q in (2, 4, 8)]
    out += [("tiles", D, B, q, S, True, False, "old") for D, B in ((128, 4), (256, 16)) for q in (3, 5, 6, 7)]
    out += [("prefill", 256, 1, q, S, True, False, "old") for q in (96, 128)]
    out += [("kept", 128, B, 16, S, True, False, "one_stage") for B in (4, 8)]
    return out + [("kept", 128, 1, 128, S, True, False, "one_stage")]


def launches(D, B, Lq, cap, windowed, alt, sm) -> tuple[dict, dict]:
    """The planned launch of each chunk (as plan_call calls launch_config) and the alternative's."""
    Hq, Hkv = SHAPES[D]
    n_sink, window = (N_SINK, WINDOW) if windowed else (None, None)
    Lc = query_chunk(Lq, Hq // Hkv, torch.bfloat16, D)
    args = (B * -(-Lq // Lc), Hq, Hkv, Lc, D, torch.bfloat16, cap, n_sink, window, sm)
    new = launch_config(*args)._asdict()
    if alt == "one_stage":
        return new, {**new, "num_stages": 1}
    if not windowed:  # the old short branch: one wave below 2.0 (floor), so one block a program
        n_blk = -(-cap // new["block_n"])
        return new, launch_config(*args, num_splits=n_blk)._asdict()
    return new, {**new, "num_stages": launch_config(*args, num_splits=1).num_stages}  # the no-rule branch's stages


def write(res) -> None:
    with open(OUT + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(OUT + ".tmp", OUT)


t0 = time.perf_counter()
sm = torch.cuda.get_device_properties(0).multi_processor_count
res = {"command": f"python3 metrics/experiments/exp58-untimed-launches.py {OUT}", "environment": environment(
       torch.device("cuda")), "doc": __doc__, "sm_count": sm, "n_sink": N_SINK, "window": WINDOW,
       "page_size": PAGE_SIZE, "unit": "us: graph_ms, median of 3 rounds", "complete": False, "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for group, D, B, Lq, cap, windowed, paged, alt in cells():
    Hq, Hkv = SHAPES[D]
    n_sink, window = (N_SINK, WINDOW) if windowed else (None, None)
    k = torch.randn(B, Hkv, cap, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    v = torch.randn(B, Hkv, cap, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    q = torch.randn(B, Hq, Lq, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
    q_pos = torch.arange(cap - Lq, cap, device="cuda")  # (Lq,)
    if paged:
        k_pages, v_pages, table = paginate(k, v, PAGE_SIZE, gen)  # (pages, PAGE_SIZE, Hkv, D) x2, (B, pages)
        del k, v
        call = lambda **kw: ta.paged_attention_triton(q, k_pages, v_pages, table, q_pos, n_sink, window, **kw)  # noqa: E731
    else:
        call = lambda **kw: ta.attention_triton(q, k, v, q_pos, n_sink, window, **kw)  # noqa: E731
    new, other = launches(D, B, Lq, cap, windowed, alt, sm)
    variants = {"planned": {}, alt: {key: other[key] for key in KEYS}}
    row = {"group": group, "Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "q_len": Lq, "S": cap, "windowed": windowed,
           "paged": paged, "planned_launch": new, f"{alt}_launch": other, "rounds_us": {n: [] for n in variants}}
    try:
        ref = call(**variants[alt]).float()
        row["max_abs_diff"] = (call().float() - ref).abs().max().item()
        for _ in range(ROUNDS):
            for name, kw in variants.items():
                t = graph_replay_ms(lambda kw=kw: call(**kw), timed)
                row["rounds_us"][name].append(t * 1e3 if isinstance(t, float) else t)
        for name in variants:
            ok = [t for t in row["rounds_us"][name] if isinstance(t, float)]
            row[f"{name}_us"] = statistics.median(ok) if ok else None
        if row["planned_us"] and row[f"{alt}_us"]:
            row["planned_vs_alt"] = row["planned_us"] / row[f"{alt}_us"] - 1  # < 0: planned faster
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    res["rows"].append(row)
    print(group, D, B, Lq, row.get("planned_us"), row.get(f"{alt}_us"), row.get("error", ""), flush=True)
    q = k = v = k_pages = v_pages = call = None  # free the cell's cache before the next one
    torch.cuda.empty_cache()
    res["wall_time_s"] = time.perf_counter() - t0  # written after every cell: a run cut short keeps its rows
    write(res)
res["complete"] = True
write(res)
