"""Experiment 47: how long the small preset's float32 tiles take to compile for sm_90, with IEEE
and with tf32x3 dots (NOTE [tf32x3] in wmtp/attention/triton_plan.py), on the CPU, no GPU.

Run DB (metrics/gpu-tests-h200.txt), the GPU suite with tf32x3 on tiles of up to 64 rows, did not
finish within 290 s where the suite without it took 195 s; this asks whether compiling the new
tiles is what took longer. Each cell (D 64, 4 query heads on 4 kv heads, a full-set call over 1M
keys: 16, 32 and 16384 queries, the last a prefill of 64-row tiles, NOTE [Chunks]) is planned by
scripts/kernel_sm90.py for an H200 and compiled once per precision with a fresh Triton cache (one
compile each: no median), timed wall-clock with its shared memory, registers and spills.

Usage: env -u TRITON_INTERPRET PYTHONPATH=.:scripts TRITON_CACHE_DIR=$(mktemp -d) \
       python3 metrics/experiments/exp47-compile-times.py OUT.json
"""

import sys
import time

import kernel_sm90 as K
import torch
import triton

from wmtp.attention import triton_plan as tp
from wmtp.metrics import environment, write_json

PRECISION = tp.precision
result = {"experiment": 47, "command": " ".join(["python3", sys.argv[0], "OUT.json"]),
          "environment": environment("cpu"), "triton": triton.__version__, "target": "sm_90", "rows": []}
for queries in (16, 32, 16384):
    for precision in ("ieee", "tf32x3"):
        tp.precision = lambda dtype, dev, bm, D, p=precision: (p if dtype == torch.float32 and dev != "cpu" and D <= 64
                                                               else PRECISION(dtype, dev, bm, D))
        tp._static_plan.cache_clear()
        call = K.plan(4, 4, 64, queries, None, False, torch.float32)
        t0 = time.perf_counter()
        compiled = K.compile_sm90(call)
        seconds = time.perf_counter() - t0
        row = {"queries": queries, "block_m": call.kwargs["BLOCK_M"], "precision": precision,
               "compile_s": seconds, **K.resources(compiled)}
        result["rows"].append(row)
        print(row, flush=True)
tp.precision = PRECISION
write_json(sys.argv[1], result)
