"""Experiment 9: the windowed draft's launches under step_ms (wmtp/bench_timing.py: the call inside one CUDA
graph of other work, L2 cold and clean) and graph_ms, S = 1M, q_len 1, bf16, both bench shapes.

Part A: the flush before each call in step_ms: a read of 256 MB (the bench's l2_flush) against
zeroing 256 MB and then reading 256 MB (exp8's in_graph_clean), on the default launch, 5 rounds.
Part B: launches (block_n, num_warps, key blocks per split, num_stages), each timed by both methods,
then the five fastest by step_ms and the defaults again in 3 rounds (medians).
"""

import itertools
import json
import statistics
import sys
import time

import torch
import triton
from triton.testing import do_bench

from wmtp.attention.triton_attention import attention_triton
from wmtp.bench_timing import capture_graph, l2_flush, step_ms
from wmtp.metrics import environment

S, N_SINK, WINDOW = 1 << 20, 64, 4096
OUT = sys.argv[1]
t0 = time.perf_counter()
dev = torch.device("cuda")
res = {"command": "python3 metrics/experiments/exp9-step-launches.py $OUT/exp9.json", "environment": environment(dev),
       "doc": __doc__, "unit": "us", "flush": [], "launches": [], "confirm": []}
read = l2_flush(dev)
zero = torch.empty(256 << 20, dtype=torch.int8, device="cuda")


def zero_read():
    zero.zero_()
    read()


def save():
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1)


def us(x):
    return round(x * 1e3, 2) if isinstance(x, float) else x


def graph_us(fn):
    return us(float(do_bench(capture_graph(fn).replay, warmup=10, rep=30, return_mode="median")))


gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((32, 8, 128), (16, 2, 256)):
    shape = f"Hq{Hq}/Hkv{Hkv}/D{D}"
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    q = torch.randn(1, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, 1, D)
    pos = torch.tensor([S - 1], device="cuda")
    ref = attention_triton(q, k, v, pos, N_SINK, WINDOW)
    default = lambda: attention_triton(q, k, v, pos, N_SINK, WINDOW)  # noqa: E731
    runs = {"read_256MB": [], "zero_then_read_256MB": []}
    for _ in range(5):
        runs["read_256MB"].append(us(step_ms(default, read)))
        runs["zero_then_read_256MB"].append(us(step_ms(default, zero_read)))
    res["flush"].append({"shape": shape, **{f: {"runs": r, "median": statistics.median(r)} for f, r in runs.items()}})
    print(res["flush"][-1], flush=True)
    save()
    rows = [{"shape": shape, "config": "defaults", "step": us(step_ms(default, read)), "graph": graph_us(default)}]
    for bn, w, per, st in itertools.product((16, 32, 64), (2, 4, 8), (1, 2), (1, 2)):
        n = triton.cdiv(N_SINK + WINDOW, bn) + 1
        cfg = {"block_n": bn, "num_warps": w, "num_splits": triton.cdiv(n, per), "num_stages": st}
        fn = lambda cfg=cfg: attention_triton(q, k, v, pos, N_SINK, WINDOW, **cfg)  # noqa: E731
        row = {"shape": shape, "config": cfg}
        try:
            row["max_abs_diff"] = float((fn().float() - ref.float()).abs().max())
            row["step"], row["graph"] = us(step_ms(fn, read)), graph_us(fn)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(row)
    res["launches"] += rows
    save()
    ok = sorted((r for r in rows if isinstance(r.get("step"), float)), key=lambda r: r["step"])
    top = [r["config"] for r in ok[:5]] + (["defaults"] if all(r["config"] != "defaults" for r in ok[:5]) else [])
    for cfg in top:
        fn = default if cfg == "defaults" else (lambda cfg=cfg: attention_triton(q, k, v, pos, N_SINK, WINDOW, **cfg))
        steps = [us(step_ms(fn, read)) for _ in range(3)]
        graphs = [graph_us(fn) for _ in range(3)]
        res["confirm"].append({"shape": shape, "config": cfg, "step": statistics.median(steps), "steps": steps,
                               "graph": statistics.median(graphs), "graphs": graphs})
        print(res["confirm"][-1], flush=True)
    save()
    k = v = q = None
    torch.cuda.empty_cache()
