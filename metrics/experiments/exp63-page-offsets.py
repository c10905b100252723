"""Experiment 63 (session 48): a paged key loop's 64-bit offsets, and pointers formed per page.

Experiment 62 found the paged D128 draft at batch 4 slower at 1M keys than at 128K-512K in every page
layout, in order or not: the cell where the bench's page pool first passes 2^31 elements, so that the
plan gives the key loop 64-bit row offsets (``OFF``, NOTE [Offsets] in attention/triton_attention.py).
Compiled offline for sm_90 (triton 3.7.1), the old loop formed each K and V element's offset in 64
bits there; the new one (``new``) forms a 64-bit pointer per key's page and adds 32-bit offsets within
the page to it. This times both kernels with ``OFF`` as planned and forced to 64 bits (on pools below
2^31 elements, where both widths are correct), on the bench's paged cells: D128 (Hq32/Hkv8) and D256
(Hq16/Hkv2), bf16, 16-row pages permuted at random (``paginate``), sink 64 + window 4096 for the draft,
every key for the verify, queries at the end of the cache; plus the contiguous one-query drafts, whose
code the change should leave as it was. ``old`` is this library's kernel with the old loop put back
(``OLD`` below, swapped in as text), loaded as a second module. Timing: ``graph_ms`` (a CUDA graph's
replay under ``do_bench``, cold L2), three rounds with the settings interleaved, the median; outputs
``torch.equal`` across settings.

Usage: python3 metrics/experiments/exp63-page-offsets.py OUT.json
"""

import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as new
from wmtp.attention import triton_plan
from wmtp.attention.paged import paginate
from wmtp.bench_methods import PAGE_SIZE
from wmtp.bench_timing import graph_replay_ms
from wmtp.metrics import environment

N_SINK, WINDOW, ROUNDS = 64, 4096, 3
SHAPES = {128: (32, 8), 256: (16, 2)}  # D: (Hq, Hkv)
CELLS = [  # (D, B, S, q_len, windowed, paged)
    *[(128, 4, 1 << 19, q, True, True) for q in (1, 8)],  # the pool at 2^31 elements: both widths correct
    *[(D, 1, 1 << 20, q, w, True) for D in (128, 256) for w in (True, False) for q in (1, 8)],
    *[(128, 4, 1 << 20, q, True, True) for q in (1, 8)],  # past 2^31: 64-bit only
    *[(D, 1, 1 << 20, 1, True, False) for D in (128, 256)],  # contiguous
]
NEW = """            k_row = k_base + page.to(OFF) * stride_outer  # (BLOCK_N,) to each key's page: NOTE [Offsets]
            v_row = v_base + page.to(OFF) * stride_outer
            in_page = (kpos % PAGE_SIZE).to(ROW) * stride_pos  # (BLOCK_N,) the key's row in its page
        else:
            k_row = k_base + kpos.to(OFF) * stride_pos  # (BLOCK_N,) NOTE [Offsets]
            v_row = v_base + kpos.to(OFF) * stride_pos
            in_page = tl.zeros_like(offs_n)  # (BLOCK_N,) int32
        if MASKED:  # K and V are both loaded before any arithmetic: two memory round trips overlap
            k = tl.load(k_row[None, :] + (in_page[None, :] + offs_d[:, None] * stride_d), mask=kread[None, :],
                        other=0.0)
            v = tl.load(v_row[:, None] + (in_page[:, None] + offs_d[None, :] * stride_d), mask=kread[:, None],
                        other=0.0)
        else:
            k = tl.load(k_row[None, :] + (in_page[None, :] + offs_d[:, None] * stride_d))  # (D, BLOCK_N)
            v = tl.load(v_row[:, None] + (in_page[:, None] + offs_d[None, :] * stride_d))  # (BLOCK_N, D)
"""
OLD = """            krow = page.to(OFF) * stride_outer + (kpos % PAGE_SIZE).to(OFF) * stride_pos  # (BLOCK_N,)
        else:
            krow = kpos.to(OFF) * stride_pos  # (BLOCK_N,) NOTE [Offsets]
        if MASKED:  # K and V are both loaded before any arithmetic: two memory round trips overlap
            k = tl.load(k_base + krow[None, :] + offs_d[:, None] * stride_d, mask=kread[None, :], other=0.0)
            v = tl.load(v_base + krow[:, None] + offs_d[None, :] * stride_d, mask=kread[:, None], other=0.0)
        else:
            k = tl.load(k_base + krow[None, :] + offs_d[:, None] * stride_d)  # (D, BLOCK_N)
            v = tl.load(v_base + krow[:, None] + offs_d[None, :] * stride_d)  # (BLOCK_N, D)
"""
OUT = sys.argv[1]


def load_old():
    """This library's kernel module with the old key-loop offsets, as a second module of the package."""
    src = open(new.__file__).read()
    if NEW not in src:
        raise SystemExit("exp63: the kernel's key loop is not the one this script swaps out")
    path = os.path.join(tempfile.mkdtemp(), "triton_attention_exp63_old.py")  # a file: Triton reads the source
    with open(path, "w") as f:
        f.write(src.replace(NEW, OLD))
    spec = importlib.util.spec_from_file_location("wmtp.attention.triton_attention_exp63_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


def write(res) -> None:
    with open(OUT + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(OUT + ".tmp", OUT)


PLANNED = triton_plan.max_offset
modules = {"old": load_old(), "new": new}


def use(width: str) -> None:
    """Plan ``OFF`` as the library does (``planned``) or always 64-bit (``int64``); drop cached plans and kernels."""
    triton_plan.max_offset = PLANNED if width == "planned" else (lambda shape, stride: 2**31)
    triton_plan._static_plan.cache_clear()
    for m in modules.values():
        m._ATTENTION.kernels.clear()


t0 = time.perf_counter()
res = {"command": f"python3 metrics/experiments/exp63-page-offsets.py {OUT}",
       "environment": environment(torch.device("cuda")), "doc": __doc__, "n_sink": N_SINK, "window": WINDOW,
       "page_size": PAGE_SIZE, "unit": "us: graph_ms, median of 3 rounds", "complete": False, "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for D, B, S, Lq, windowed, paged in CELLS:
    Hq, Hkv = SHAPES[D]
    n_sink, window = (N_SINK, WINDOW) if windowed else (None, None)
    k = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    v = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    q = torch.randn(B, Hq, Lq, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
    q_pos = torch.arange(S - Lq, S, device="cuda")  # (Lq,)
    if paged:
        k_pages, v_pages, table = paginate(k, v, PAGE_SIZE, gen)  # (pages, PAGE_SIZE, Hkv, D) x2, (B, pages)
        k = v = None
        planned_off = "int32" if PLANNED(tuple(k_pages.shape), k_pages.stride()) < 2**31 else "int64"
        widths = ("planned",) if "int64" in planned_off else ("planned", "int64")
        calls = {f"{m}_{w}": (w, lambda m=m: modules[m].paged_attention_triton(q, k_pages, v_pages, table, q_pos,
                                                                                n_sink, window))
                 for m in modules for w in widths}
    else:
        planned_off, k_pages = "int64 (contiguous)", None
        calls = {f"{m}_planned": ("planned", lambda m=m: modules[m].attention_triton(q, k, v, q_pos, n_sink, window))
                 for m in modules}
    row = {"D": D, "Hq": Hq, "Hkv": Hkv, "B": B, "S": S, "q_len": Lq, "windowed": windowed, "paged": paged,
           "planned_off": planned_off, "rounds_us": {name: [] for name in calls}, "us": {}, "equal": {}}
    try:
        ref = None
        for name, (width, fn) in calls.items():
            use(width)
            out = fn()
            ref = out if ref is None else ref
            row["equal"][name] = bool(torch.equal(out, ref))
        for _ in range(ROUNDS):
            for name, (width, fn) in calls.items():
                use(width)
                t = graph_replay_ms(fn, timed)
                row["rounds_us"][name].append(t * 1e3 if isinstance(t, float) else t)
        for name, ts in row["rounds_us"].items():
            ok = [t for t in ts if isinstance(t, float)]
            row["us"][name] = statistics.median(ok) if ok else None
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    res["rows"].append(row)
    print(D, B, S, Lq, "window" if windowed else "full", "paged" if paged else "contiguous", planned_off,
          {n: round(t, 2) for n, t in row["us"].items() if t}, all(row["equal"].values()), row.get("error", ""),
          flush=True)
    res["wall_time_s"] = time.perf_counter() - t0  # written after every row: a run cut short keeps its rows
    write(res)
    q = k = v = k_pages = v_pages = table = calls = ref = out = None  # free the cell's cache before the next one
    torch.cuda.empty_cache()
use("planned")
res["complete"] = True
write(res)
