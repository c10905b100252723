"""Experiment 13 (session 7): where the host's time goes in one Triton draft call.

``wmtp bench attention`` times every call three ways; the plain ``do_bench`` of the windowed draft
(62 / 162 us at 1M, D128 / D256, metrics/bench-attention-h200.json) is host-bound: ``host_ms``
reads 94 / 197 us. This script measures the Python launcher's parts on an H200, back to back
without a sync (the device idle or not, the host's time per call), each as the median of 7 rounds
of 500 calls (each part measured twice, forward and backward through the list; the lower of the
two kept), and a cProfile of 500 whole calls:

    PYTHONPATH=$PWD python3 metrics/experiments/exp13-host.py $OUT/exp13.json

Cells: the draft (``q_len`` 1, 64 sinks + 4096 window, bf16) at S = 64K (the host's work does not
depend on S), both bench shapes.
"""

import cProfile
import io
import json
import pstats
import statistics
import sys
import time

import torch
from triton.testing import do_bench

import wmtp
from wmtp.attention import triton_attention as ta
from wmtp.attention.plan import by_query_chunks, check_tensors, launch_config
from wmtp.metrics import environment

S, N_SINK, WINDOW, CALLS, ROUNDS = 1 << 16, 64, 4096, 500, 7
OUT = sys.argv[1]
CODE = sys.argv[2] if len(sys.argv) > 2 else None  # which tree's wmtp is on PYTHONPATH, for the record
dev = torch.device("cuda")
res = {"command": "PYTHONPATH=$PWD python3 metrics/experiments/exp13-host.py $OUT/exp13.json",
       "code": CODE, "environment": environment(dev), "doc": __doc__, "unit": "us per call", "cells": {}}


def per_call_us(fn):
    rounds = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        rounds.append((time.perf_counter() - t0) / CALLS * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(rounds), 2)


gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    k = torch.randn(1, Hkv, S, D, device=dev, dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    v = torch.randn(1, Hkv, S, D, device=dev, dtype=torch.bfloat16, generator=gen)
    q = torch.randn(1, Hq, 1, D, device=dev, dtype=torch.bfloat16, generator=gen)  # (1, Hq, 1, D)
    pos = torch.tensor([S - 1], device=dev)
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    limits = ta._gpu_limits(dev)
    tuning = (None,) * 5
    call = ta.plan_call(q, kt, vt, None, 1, pos, N_SINK, WINDOW, tuning, limits)
    ta._launch(q, kt, vt, None, 1, pos, N_SINK, WINDOW, tuning)  # compile
    parts = {
        "wmtp.attention (public op)": lambda: wmtp.attention(q, k, v, pos, N_SINK, WINDOW, impl="triton"),
        "attention_triton": lambda: ta.attention_triton(q, k, v, pos, N_SINK, WINDOW),
        "_launch": lambda: ta._launch(q, kt, vt, None, 1, pos, N_SINK, WINDOW, tuning),
        "check_tensors": lambda: check_tensors(q, k, v, pos),
        "by_query_chunks (no-op run)": lambda: by_query_chunks(q, pos, Hq // Hkv, lambda a, b: a),
        "plan_call": lambda: ta.plan_call(q, kt, vt, None, 1, pos, N_SINK, WINDOW, tuning, limits),
        "launch_config": lambda: launch_config(1, Hq, Hkv, 1, D, q.dtype, S, N_SINK, WINDOW, limits[0]),
        "torch.empty_like + workspace": lambda: (torch.empty_like(q), torch.empty(1000, device=dev)),
        "_attention_kernel[grid] launch": lambda: ta._attention_kernel[call.grid](*call.args, **call.kwargs),
        "merge_splits launch": lambda: ta.merge_splits(*call.merge),
    }
    order = list(parts) + list(parts)[::-1]  # each part twice, forward then backward: order effects show
    times = {name: [] for name in parts}
    for name in order:
        times[name].append(per_call_us(parts[name]))
    cell = {"per_call_us": {name: min(t) for name, t in times.items()}, "per_call_us_both_passes": times}
    flush_buf = torch.empty(256 << 20, dtype=torch.int8, device=dev)
    cell["flush_device_us"] = round(float(do_bench(flush_buf.zero_, warmup=25, rep=100, return_mode="median")) * 1e3, 1)
    cell["plain_do_bench_us"] = round(float(do_bench(parts["attention_triton"], warmup=25, rep=100,
                                                     return_mode="median")) * 1e3, 1)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        ta.attention_triton(q, k, v, pos, N_SINK, WINDOW)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    cell["cprofile_tottime_top30"] = text.getvalue().splitlines()
    res["cells"][f"Hq{Hq}/Hkv{Hkv}/D{D}"] = cell
    print(json.dumps(cell["per_call_us"], indent=1), cell["flush_device_us"], cell["plain_do_bench_us"], flush=True)
with open(OUT, "w") as f:
    json.dump(res, f, indent=1)
