"""Experiment 10: step_ms (wmtp/bench_timing.py) of the windowed draft, S = 1M, bf16, q_len 1 and 8, both bench
shapes, with five calls before each draft in the graph, against graph_ms (the bench's do_bench of a
replay). In the sweep at b929d7e step_ms was 3-4 us under graph_ms at q_len 1 but 5-7 us over it at
q_len 8; which part of the flush does that?

flushes: read (the bench's l2_flush: a sum over 256 MB, a kernel on every SM), fill (zero_ of 256 MB,
do_bench's flush, a kernel), copy (a 256 MB device-to-device copy_, which torch hands to
cudaMemcpyAsync), fill_read (fill, then read: exp8's in_graph_clean), none (a one-element kernel: L2 warm, in a graph).
3 rounds, medians, us.
"""

import json
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention.triton_attention import attention_triton
from wmtp.bench_timing import capture_graph, l2_flush, step_ms
from wmtp.metrics import environment

S, N_SINK, WINDOW = 1 << 20, 64, 4096
OUT = sys.argv[1]
t0 = time.perf_counter()
dev = torch.device("cuda")
res = {"command": "python3 metrics/experiments/exp10-step-flush.py $OUT/exp10.json", "environment": environment(dev),
       "doc": __doc__, "unit": "us", "rows": []}
read = l2_flush(dev)
buf = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
dst = torch.empty_like(buf)
tiny = torch.zeros(1, device="cuda")
FLUSHES = {"read": read, "fill": buf.zero_, "copy": lambda: dst.copy_(buf),
           "fill_read": lambda: (buf.zero_(), read()), "none": lambda: tiny.add_(1)}

gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    for q_len in (1, 8):
        q = torch.randn(1, Hq, q_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, Lq, D)
        pos = torch.arange(S - q_len, S, device="cuda")
        fn = lambda q=q, pos=pos: attention_triton(q, k, v, pos, N_SINK, WINDOW)  # noqa: E731
        runs = {name: [] for name in ["graph_ms", *FLUSHES]}
        for _ in range(3):
            runs["graph_ms"].append(float(do_bench(capture_graph(fn).replay, warmup=10, rep=30,
                                                   return_mode="median")) * 1e3)
            for name, flush in FLUSHES.items():
                t = step_ms(fn, flush)
                runs[name].append(t * 1e3 if isinstance(t, float) else t)
        row = {"shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", "q_len": q_len,
               **{n: round(statistics.median(r), 2) if all(isinstance(x, float) for x in r) else r
                  for n, r in runs.items()}}
        res["rows"].append(row)
        print(row, flush=True)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(OUT, "w") as f:
            json.dump(res, f, indent=1)
    k = v = None
    torch.cuda.empty_cache()
