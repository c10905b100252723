"""Experiment 6: paged verify (full causal set, page size 16) launch options at S = 1M, q_len 8 and 1,
timed as the bench times it (do_bench of plain calls, cold L2, median); % of the bench's HBM floor."""

import json
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.attention.paged import paginate
from wmtp.bench_report import method_bytes
from wmtp.metrics import environment

S, PAGE = 1 << 20, 16
OUT = sys.argv[1]
BW = 4250e9  # the bench's measured copy bandwidth on these machines (bench-attention-h200.json)
t0 = time.perf_counter()
res = {"command": "python3 exp/paged.py $OUT/paged.json", "environment": environment(torch.device("cuda")),
       "method": "do_bench(plain call, warmup 10 ms, rep 40 ms, median); pct = bytes / 4250 GB/s / ms", "rows": []}
gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    kp, vp, bt = paginate(k, v, PAGE, gen)
    del k, v
    for Lq in (8, 1):
        q = torch.randn(1, Hq, Lq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        pos = torch.arange(S - Lq, S, device="cuda")
        nbytes = method_bytes("triton_full_paged", S, Hq, Hkv, D, Lq, 2)
        ref = ta.paged_attention_triton(q, kp, vp, bt, pos)
        cfgs = [{}] + [dict(block_n=bn, num_stages=st, num_warps=w) for bn in (16, 32, 64) for st in (2, 3, 4)
                       for w in (4, 8)]
        for cfg in cfgs:
            row = {"shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", "q_len": Lq, **cfg}
            try:
                fn = lambda: ta.paged_attention_triton(q, kp, vp, bt, pos, **cfg)  # noqa: E731
                row["max_abs_diff"] = float((fn().float() - ref.float()).abs().max())
                ms = float(do_bench(fn, warmup=10, rep=40, return_mode="median"))
                row["ms"], row["pct_of_floor"] = round(ms, 4), round(nbytes / BW / ms * 1e5, 1)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:200]
            res["rows"].append(row)
            print(row, flush=True)
            res["wall_s"] = round(time.perf_counter() - t0, 1)
            with open(OUT, "w") as f:
                json.dump(res, f, indent=1)
