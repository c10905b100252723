"""Experiment 61 (session 47): a deep windowed tile's stages past its loop limit and past one wave.

attention/plan.py gives a windowed 2-32-query tile at D >= 128 its shared-memory fit (3 or 4 stages)
past its loop limit (44 blocks a program for D256 64-row tiles, 40 otherwise; NOTE [Launch]).
Experiment 60 on an H100 (sessions 46 and 47, two runs within 1 %) found three stages 7-12 % faster than
the planned four for D256 64-row tiles at 66-132 blocks, and at batch 80 (160 programs on 132 SMs) two
stages 36 % faster than four: there a program's two stages plus its query tile leave room for a second
program on the SM. This times every stage count at loops past the limit, from below one wave of
programs to three: D256 with 8 queries (64 rows, 32-key blocks), 4 (32 rows) and 2 (16 rows) at 132
blocks; D128 with 32 queries (128 rows), 16 (64) and 8 (32) at 67 blocks (64-key blocks); the planned
splits throughout (one a tile at these batches). bf16, sink 64 + window 4096, S = 32768 (the kernel
reads the sinks and the window only: flat in S; the smaller cache holds batch 200), contiguous caches,
the bench's shapes. Timing as experiments 59-60: ``graph_ms`` (a CUDA graph's replay under
``triton.testing.do_bench``, cold L2, median), three rounds with the variants interleaved, the median
of the three; ``max_abs_diff`` against the planned launch. ``kernels`` lists the compiled kernels'
registers and shared memory (from Triton's cache; best effort), which say how many programs share an SM.

Groups (``waves`` by default, the cells above): ``paged``, seven of them in the bench's 16-row pages (one
stage runs PAGED=1, more PAGED=2, NOTE [Pages]); ``prefill``, D256 windowed prefills of 96 queries at batch
8 and 128 at batch 2, planned by 8-query chunks as ``plan_call`` does; ``paged128`` (after the second run
found one stage 10-18 % faster than the planned two for D128 128-row tiles in pages), D128 with 32 queries
at more batches and D128 windowed prefills (32-query chunks) in pages, ``prefill128`` those prefills
contiguous. Rows name the planned launch of the
library they ran with: the first run (fe12fda) planned the fit (3 or 4) past the loop limit, later runs
``_extend_stages`` (attention/plan.py).

Usage: python3 metrics/experiments/exp61-stages-waves.py OUT.json [GROUP ...]
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
from wmtp.attention.plan import SMEM_H200, SMEM_HEADROOM, _cdiv, launch_config, query_chunk
from wmtp.bench_methods import PAGE_SIZE
from wmtp.bench_timing import graph_replay_ms
from wmtp.metrics import environment

S, N_SINK, WINDOW, ROUNDS = 1 << 15, 64, 4096, 3
SHAPES = {128: (32, 8), 256: (16, 2)}  # D: (Hq, Hkv)
OUT, GROUP_NAMES = sys.argv[1], sys.argv[2:] or ["waves"]
KEYS = ("num_splits", "block_n", "num_warps", "num_stages")
GROUPS = {  # (D, B, q_len)
    "waves": ([(256, B, 8) for B in (50, 66, 67, 80, 100, 132, 200)]  # 100-400 programs
              + [(256, B, q) for q in (4, 2) for B in (80, 132)]
              + [(128, B, 32) for B in (9, 17, 25, 33)]  # 72-264 programs
              + [(128, B, 16) for B in (17, 25, 33)]
              + [(128, B, 8) for B in (17, 33)]),
    "paged": [(256, B, 8) for B in (34, 66, 67, 100)] + [(128, 9, 32), (128, 25, 32), (128, 25, 16)],
    "prefill": [(256, 8, 96), (256, 2, 128)],
    "paged128": [(128, B, 32) for B in (3, 6, 17, 33)] + [(128, 4, 96), (128, 2, 256), (128, 8, 128)],
    "prefill128": [(128, 4, 96), (128, 2, 256), (128, 8, 128)],
}
CELLS = [(name, *cell) for name in GROUP_NAMES for cell in GROUPS[name]]


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


def write(res) -> None:
    with open(OUT + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(OUT + ".tmp", OUT)


def shared_fit(block_m: int, block_n: int, D: int) -> int:
    """The K/V stages a bf16 tile's shared memory holds: launch_config's ``fit`` (fe12fda), spelled out
    here because later planners give deep windowed tiles other stages with one split."""
    budget = min(200 * 1024, SMEM_H200 - SMEM_HEADROOM)
    stage = 2 * block_n * D * 2  # one K block and one V block, bf16
    two_per_sm = block_m * D * 4 <= 32 * 1024 and 6 * stage <= budget
    return 3 if two_per_sm else max(1, min(4, budget // stage))


def kernels() -> list:
    """Registers, spills and shared memory of every compiled attention kernel (Triton 3.x caches)."""
    found = []
    for caches in ta._attention_kernel.device_caches.values():
        for kernel in caches[0].values():
            meta = kernel.metadata
            found.append({"num_warps": meta.num_warps, "num_stages": meta.num_stages, "shared": meta.shared,
                          "n_regs": kernel.n_regs, "n_spills": kernel.n_spills,
                          "constants": str(getattr(kernel.src, "constants", ""))[:400]})
    return found


t0 = time.perf_counter()
props = torch.cuda.get_device_properties(0)
sm = props.multi_processor_count
smem = getattr(props, "shared_memory_per_block_optin", None)
res = {"command": " ".join(["python3 metrics/experiments/exp61-stages-waves.py", OUT, *sys.argv[2:]]),
       "environment": environment(torch.device("cuda")), "doc": __doc__, "sm_count": sm, "smem_optin": smem,
       "S": S, "n_sink": N_SINK, "window": WINDOW, "unit": "us: graph_ms, median of 3 rounds", "complete": False,
       "rows": []}
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
    Lc = query_chunk(Lq, Hq // Hkv, torch.bfloat16, D)  # a tile's queries
    args = (B * _cdiv(Lq, Lc), Hq, Hkv, Lc, D, torch.bfloat16, S, N_SINK, WINDOW, sm)  # as plan_call calls it
    planned = launch_config(*args)._asdict()
    n_blk = _cdiv(N_SINK + WINDOW + Lc - 1, planned["block_n"]) + 1
    fit = shared_fit(planned["block_m"], planned["block_n"], D)  # the stages of the long branch
    base = {key: planned[key] for key in KEYS}
    variants = {f"stages_{n}": {**base, "num_stages": n} for n in range(1, max(fit, planned["num_stages"]) + 1)}
    programs = args[0] * Hkv * planned["num_splits"]
    row = {"group": group, "D": D, "Hq": Hq, "Hkv": Hkv, "B": B, "q_len": Lq, "tiles": args[0],
           "planned_launch": planned,
           "fit": fit, "loop_blocks": _cdiv(n_blk, planned["num_splits"]), "programs": programs,
           "waves_one_per_sm": programs / sm,
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
    print(group, D, B, Lq, row["loop_blocks"], programs, planned["num_stages"], times, row.get("error", ""), flush=True)
    q = k = v = k_pages = v_pages = call = None  # free the cell's cache before the next one
    torch.cuda.empty_cache()
    res["wall_time_s"] = time.perf_counter() - t0  # written after every cell: a run cut short keeps its rows
    write(res)
try:
    res["kernels"] = kernels()
except Exception as e:  # the cache's layout is Triton's, not an API
    res["kernels"] = f"{type(e).__name__}: {e}"[:300]
res["complete"] = True
write(res)
