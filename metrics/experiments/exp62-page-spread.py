"""Experiment 62 (session 48): why the paged D128 draft is not flat in S at batch 4.

The batch-4 sweeps (docs/results/gpu-attention.md, "Batch 4 on an H100" and session 45's H200 run) read
the paged D128 one-query draft at 1M keys 14-24 % slower than at 16K-512K (H100 56.3-56.9 against
47.6-49.2 us; H200 47.5 against 36.0 contiguous), where the contiguous draft, and every D256 or batch-1
paged draft, is flat. The bench's pages (``paginate``) are permuted at random over a pool of
``B * ceil(S / 16)`` pages: at D128, batch 4 and 1M, 8.6 GB for K and as much for V, each 16-row page
32 KiB. The key set (sink 64 + window 4096) touches the same number of pages at every S; what grows
with S is only how far apart they lie. Address translation is one guess; this run tests it.

Four layouts of one cache, the same pages of K and V read (only the block table and where pages lie
differ), outputs ``torch.equal`` to the contiguous call:
- ``contiguous``: ``attention_triton`` over ``(B, Hkv, S, D)``, the reference time;
- ``random``: the bench's layout (``paginate``), each page anywhere in the pool;
- ``identity``: page ``p`` of row ``b`` at ``b * n_pages + p``: the same pool, pages in order;
- ``blocks2m``: 2 MiB runs of pages (64 pages at D128, 128 at D256) kept whole and in order, the runs
  permuted at random over the pool: as spread as ``random`` at a 2 MiB grain, in order within it;
- ``packed``: the pages the key set touches permuted at random within the pool's first few MiB,
  every other page at random after them: as scattered as ``random`` page by page, in a small span.
If ``blocks2m`` and ``packed`` are as fast as ``identity`` while ``random`` is slower at 1M, the cost
is the number of distinct 2 MiB regions a call touches over a large span (translation), not the page
order. Shapes as the bench's: D128 (Hq32/Hkv8) and D256 (Hq16/Hkv2), bf16, 16-row pages, the planned
launch. Timings: ``graph_ms`` (the bench's: a CUDA graph's replay under ``do_bench``, cold L2; median
of three interleaved rounds) and ``step_ms`` (wmtp/bench_timing.py; one reading a cell, itself a median
of 25 replays).

Usage: python3 metrics/experiments/exp62-page-spread.py OUT.json
"""

import json
import os
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.bench_methods import PAGE_SIZE
from wmtp.bench_timing import graph_replay_ms, l2_flush, step_ms
from wmtp.metrics import environment

N_SINK, WINDOW, ROUNDS = 64, 4096, 3
SHAPES = {128: (32, 8), 256: (16, 2)}  # D: (Hq, Hkv)
CELLS = [(D, B, S) for D in (128, 256) for B in (4, 1) for S in (1 << 17, 1 << 19, 1 << 20)]
LAYOUTS = ("contiguous", "random", "identity", "blocks2m", "packed")
OUT = sys.argv[1]


def timed(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=30, return_mode="median"))


def write(res) -> None:
    with open(OUT + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(OUT + ".tmp", OUT)


def tables(B: int, S: int, page_bytes: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Each paged layout's page of every logical page, ``(B * n_pages,)`` int64: logical page ``b * n + p``
    lies at physical page ``perm[b * n + p]``."""
    n = -(-S // PAGE_SIZE)  # pages a row
    total = B * n
    run = max(1, (2 << 20) // page_bytes)  # pages in 2 MiB
    runs = -(-total // run)
    order = torch.randperm(runs, generator=gen)  # (runs,)
    blocks = (order[:, None] * run + torch.arange(run)).flatten()  # (runs * run,) runs in a random order
    p = torch.arange(n)  # (n,)
    first = S - 8 - WINDOW + 1  # the first window key of the earliest of up to 8 queries (t = S - 8)
    touched = (p < -(-N_SINK // PAGE_SIZE)) | ((p + 1) * PAGE_SIZE > first)  # (n,) pages the key set reads
    hot = (torch.arange(B)[:, None] * n + p[touched]).flatten()  # (B * touched,) logical ids
    cold = (torch.arange(B)[:, None] * n + p[~touched]).flatten()
    packed = torch.empty(total, dtype=torch.long)
    packed[hot] = torch.randperm(hot.numel(), generator=gen)
    packed[cold] = hot.numel() + torch.randperm(cold.numel(), generator=gen)
    out = {"random": torch.randperm(total, generator=gen), "identity": torch.arange(total), "packed": packed}
    if total % run == 0:  # whole 2 MiB runs (every cell here)
        out["blocks2m"] = blocks
    return out


t0 = time.perf_counter()
props = torch.cuda.get_device_properties(0)
res = {"command": f"python3 metrics/experiments/exp62-page-spread.py {OUT}",
       "environment": environment(torch.device("cuda")), "doc": __doc__, "sm_count": props.multi_processor_count,
       "n_sink": N_SINK, "window": WINDOW, "page_size": PAGE_SIZE, "unit": "us", "complete": False, "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
cpu_gen = torch.Generator().manual_seed(0)
flush = l2_flush(torch.device("cuda"))
for D, B, S in CELLS:
    Hq, Hkv = SHAPES[D]
    n = -(-S // PAGE_SIZE)
    page_bytes = PAGE_SIZE * Hkv * D * 2
    k = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    v = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    logical = [x.view(B, Hkv, n, PAGE_SIZE, D).permute(0, 2, 3, 1, 4).reshape(B * n, PAGE_SIZE, Hkv, D)
               for x in (k, v)]  # (B * n, PAGE_SIZE, Hkv, D) each: pages in logical order (copies)
    pools = [torch.empty_like(x) for x in logical]  # (B * n, PAGE_SIZE, Hkv, D) each, refilled per layout
    perms = tables(B, S, page_bytes, cpu_gen)
    for Lq in (1, 8):
        q = torch.randn(B, Hq, Lq, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
        q_pos = torch.arange(S - Lq, S, device="cuda")  # (Lq,)
        row = {"D": D, "Hq": Hq, "Hkv": Hkv, "B": B, "S": S, "q_len": Lq, "page_bytes": page_bytes,
               "pool_bytes_kv": 2 * B * n * page_bytes, "graph_rounds_us": {}, "graph_ms_us": {}, "step_ms_us": {},
               "equal_to_contiguous": {}}
        ref = ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW)
        calls = {"contiguous": lambda: ta.attention_triton(q, k, v, q_pos, N_SINK, WINDOW)}
        for name in LAYOUTS[1:]:
            if name in perms:
                calls[name] = name  # filled per layout below: one pool, refilled
        try:
            for r in range(ROUNDS):
                for name in calls:
                    if name == "contiguous":
                        fn = calls[name]
                    else:
                        perm = perms[name].to("cuda")
                        for pool, x in zip(pools, logical):
                            pool[perm] = x
                        table = perm.view(B, n).to(torch.int32)  # (B, n)
                        fn = lambda table=table: ta.paged_attention_triton(  # noqa: E731
                            q, pools[0], pools[1], table, q_pos, N_SINK, WINDOW)
                        if r == 0:
                            out = fn()
                            row["equal_to_contiguous"][name] = bool(torch.equal(out, ref))
                            row.setdefault("max_abs_diff", {})[name] = (out.float() - ref.float()).abs().max().item()
                    t = graph_replay_ms(fn, timed)
                    row["graph_rounds_us"].setdefault(name, []).append(t * 1e3 if isinstance(t, float) else t)
                    if r == ROUNDS - 1:
                        s = step_ms(fn, flush)
                        row["step_ms_us"][name] = s * 1e3 if isinstance(s, float) else s
            for name, ts in row["graph_rounds_us"].items():
                ok = [t for t in ts if isinstance(t, float)]
                row["graph_ms_us"][name] = statistics.median(ok) if ok else None
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        res["rows"].append(row)
        print(D, B, S, Lq, {k_: round(t, 2) for k_, t in row["graph_ms_us"].items() if t},
              {k_: round(t, 2) for k_, t in row["step_ms_us"].items() if isinstance(t, float)},
              row["equal_to_contiguous"], row.get("error", ""), flush=True)
        res["wall_time_s"] = time.perf_counter() - t0  # written after every row: a run cut short keeps its rows
        write(res)
    k = v = logical = pools = q = ref = None  # free the cell's cache before the next one
    torch.cuda.empty_cache()
res["complete"] = True
write(res)
