"""Experiment 5: the draft's two kernels timed apart per launch, in the bench's method
(do_bench of a CUDA-graph replay, cold dirty L2, median), S = 1M, q_len 1, both shapes."""

import json
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.bench_timing import capture_graph
from wmtp.metrics import environment

S, N_SINK, WINDOW = 1 << 20, 64, 4096
OUT = sys.argv[1]
t0 = time.perf_counter()
res = {"command": "python3 exp/breakdown.py $OUT/breakdown.json", "environment": environment(torch.device("cuda")),
       "method": "do_bench(CUDA-graph replay, warmup 25 ms, rep 100 ms, median) x 3 rounds, median; us", "rows": []}


def us(fn):
    return float(do_bench(capture_graph(fn).replay, warmup=25, rep=100, return_mode="median")) * 1e3


def med3(fn):
    return round(statistics.median(us(fn) for _ in range(3)), 2)


gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    q = torch.randn(1, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    pos = torch.tensor([S - 1], device="cuda")
    ref = ta.attention_triton(q, k, v, pos, N_SINK, WINDOW, pdl=False)
    for bn, w in ((64, 4), (64, 8), (32, 4), (32, 8), (16, 4), (16, 8), (128, 8)):
        cfg = dict(block_n=bn, num_warps=w)
        row = {"shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", **cfg}
        try:
            call = lambda: ta.attention_triton(q, k, v, pos, N_SINK, WINDOW, **cfg)  # noqa: E731
            row["max_abs_diff"] = float((call().float() - ref.float()).abs().max())
            row["draft"] = med3(call)
            captured, real = [], ta.merge_splits
            ta.merge_splits = lambda *a, **kw: captured.append((a, kw))
            try:
                row["attention_alone"] = med3(call)
            finally:
                ta.merge_splits = real
            a, kw = captured[-1]
            row["num_splits"] = a[6]
            row["merge_alone_cold"] = med3(lambda: real(*a, **kw))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        res["rows"].append(row)
        print(row, flush=True)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(OUT, "w") as f:
            json.dump(res, f, indent=1)

# the merge launched with other slices of the head dim and warps, in the full draft (partials in L2)
import triton  # noqa: E402

from wmtp.attention import triton_merge as tm  # noqa: E402


def make_merge(block_d, warps):
    def merge(pm, pl, pacc, out, Hkv, block_m, num_splits, pdl, max_chunk=256):
        B, Hq_, Lq, D_ = out.shape
        chunk = min(triton.next_power_of_2(num_splits), max_chunk)
        bd = min(D_, block_d)
        tm._merge_kernel[(B * Hkv, Hq_ // Hkv * Lq, D_ // bd)](
            pm, pl, pacc, out, *out.stride(), Hkv, Lq, num_splits, GROUP=Hq_ // Hkv, BLOCK_M=block_m,
            SPLIT_CHUNK=chunk, HEAD_DIM=D_, BLOCK_D=bd, PDL=pdl, num_warps=warps,
            **({"launch_pdl": True} if pdl else {}))
    return merge


for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    q = torch.randn(1, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    pos = torch.tensor([S - 1], device="cuda")
    ref = ta.attention_triton(q, k, v, pos, N_SINK, WINDOW, pdl=False)
    for bn, w in ((64, 4), (32, 8), (16, 4)):
        for bd, mw in ((16, 4), (32, 4), (64, 4), (16, 2), (32, 2), (32, 1), (64, 8)):
            cfg = dict(block_n=bn, num_warps=w)
            row = {"shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", **cfg, "merge_block_d": bd, "merge_warps": mw}
            real = ta.merge_splits
            ta.merge_splits = make_merge(bd, mw)
            try:
                call = lambda: ta.attention_triton(q, k, v, pos, N_SINK, WINDOW, **cfg)  # noqa: E731
                row["max_abs_diff"] = float((call().float() - ref.float()).abs().max())
                row["draft"] = med3(call)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            finally:
                ta.merge_splits = real
            res["rows"].append(row)
            print(row, flush=True)
            res["wall_s"] = round(time.perf_counter() - t0, 1)
            with open(OUT, "w") as f:
                json.dump(res, f, indent=1)
