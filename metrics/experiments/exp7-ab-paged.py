"""Experiment 7: the block table read one block ahead (working tree) against HEAD's kernel
(triton_attention_old), paged caches (page size 16), S = 1M, rounds interleaved.
Verify: plain calls, do_bench median, % of the bench's floor (4250 GB/s); draft: graph replay, us."""

import json
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as new
from wmtp.attention import triton_attention_old as old
from wmtp.attention.paged import paginate
from wmtp.bench_report import method_bytes
from wmtp.bench_timing import capture_graph
from wmtp.metrics import environment

S, PAGE, N_SINK, WINDOW, BW = 1 << 20, 16, 64, 4096, 4250e9
OUT = sys.argv[1]
t0 = time.perf_counter()
res = {"command": "python3 exp/ab_paged.py $OUT/ab_paged.json", "environment": environment(torch.device("cuda")),
       "method": "verify: do_bench(plain call, warmup 10, rep 40, median) ms; draft: do_bench(graph replay, warmup 25, "
                 "rep 100, median) us; 3 interleaved rounds, median", "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    kp, vp, bt = paginate(k, v, PAGE, gen)
    del k, v
    for kind, Lq in (("verify", 8), ("verify", 1), ("draft", 1), ("draft", 8)):
        window = None if kind == "verify" else WINDOW
        q = torch.randn(1, Hq, Lq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        pos = torch.arange(S - Lq - 5, S - 5, device="cuda")  # not block-aligned
        fns = {m: (lambda mod=mod: mod.paged_attention_triton(q, kp, vp, bt, pos, N_SINK, window))
               for m, mod in (("old", old), ("new", new))}
        diff = float((fns["new"]().float() - fns["old"]().float()).abs().max())
        ts = {m: [] for m in fns}
        for _ in range(3):
            for m, fn in fns.items():
                if kind == "verify":
                    ts[m].append(float(do_bench(fn, warmup=10, rep=40, return_mode="median")))
                else:
                    g = capture_graph(fn)
                    ts[m].append(float(do_bench(g.replay, warmup=25, rep=100, return_mode="median")) * 1e3)
        row = {"kind": kind, "shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", "q_len": Lq, "unit": "ms" if kind == "verify" else "us",
               "max_abs_diff_new_vs_old": diff, "rounds": ts,
               **{m: round(statistics.median(t), 4) for m, t in ts.items()}}
        if kind == "verify":
            nbytes = method_bytes("triton_full_paged", S, Hq, Hkv, D, Lq, 2)
            row.update({f"pct_{m}": round(nbytes / BW / row[m] * 1e5, 1) for m in fns})
        res["rows"].append(row)
        print({k_: v_ for k_, v_ in row.items() if k_ != "rounds"}, flush=True)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(OUT, "w") as f:
            json.dump(res, f, indent=1)
