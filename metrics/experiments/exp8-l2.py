"""Experiment 8: the windowed draft (S = 1M, q_len 1, bf16) under six timings, with and without an
L2 evict-first hint on its K/V loads (exp8-evict.patch adds the hint; run from a tree with it applied).

Question: how much of the bench's draft time is the timing method rather than the kernel?
- do_bench zeroes 256 MB before each timed call, which leaves L2 full of DIRTY lines: each byte the
  timed kernel reads first writes a dirty line back (the hypothesis), so reading costs twice its bytes.
- One graph replayed alone pays the graph's launch latency (graph_floor_ms: 4.5 us for an empty kernel).
Timings (each of a call captured in a CUDA graph, median, us):
  do_bench: the bench's graph_ms (triton.testing.do_bench of the replay);
  dirty:    events around each replay, after zeroing 256 MB (do_bench's own loop, re-done);
  clean:    the same, after zeroing 256 MB and then reading another 256 MB (L2 cold but clean);
  warm:     events around each replay, no flush (L2 holds the last call's bytes);
  in_graph_dirty / in_graph_clean: ONE graph of 32 x (flush, call) minus one of 32 x (flush), / 32:
            what the call adds inside a graph of other work (a decode step), cold L2 either way.
"""

import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.bench_read import READ_CONFIGS, read_key_set
from wmtp.bench_timing import capture_graph
from wmtp.metrics import environment

S, N_SINK, WINDOW, REPS, N_GRAPH, ROUNDS = 1 << 20, 64, 4096, 200, 32, 3
OUT = sys.argv[1]
t0 = time.perf_counter()
res = {"command": "python3 metrics/experiments/exp8-l2.py $OUT/exp8.json (tree with exp8-evict.patch applied)",
       "environment": environment(torch.device("cuda")), "doc": __doc__,
       "unit": "us, median of 3 rounds (each a median)", "rows": []}
cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")  # do_bench's flush buffer
clean = torch.randn(64 << 20, device="cuda")  # 256 MB read after the zeroing: L2 ends full of clean lines
total = torch.empty((), device="cuda")


def flush_dirty():
    cache.zero_()


def flush_clean():
    cache.zero_()
    torch.sum(clean, dim=0, out=total)


def events_us(fn, flush):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for i in range(REPS):
        if flush is not None:
            flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def in_graph_us(fn, flush):
    def both():
        for _ in range(N_GRAPH):
            flush()
            fn()

    def only():
        for _ in range(N_GRAPH):
            flush()

    g_both, g_only = capture_graph(both), capture_graph(only)
    return (events_us(g_both.replay, None) - events_us(g_only.replay, None)) / N_GRAPH


def timings(fn):
    g = capture_graph(fn)
    return {"do_bench": float(do_bench(g.replay, warmup=25, rep=100, return_mode="median")) * 1e3,
            "dirty": events_us(g.replay, flush_dirty), "clean": events_us(g.replay, flush_clean),
            "warm": events_us(g.replay, None),
            "in_graph_dirty": in_graph_us(fn, flush_dirty), "in_graph_clean": in_graph_us(fn, flush_clean)}


def targets(q, k, v, pos, kc, vc):
    out = {}
    for ev in ("", "evict_first"):
        tag = ev or "normal"

        def draft(ev=ev):
            ta.EVICT = ev
            return ta.attention_triton(q, k, v, pos, N_SINK, WINDOW)

        out[f"draft/{tag}"] = draft
        for bn, w in READ_CONFIGS:
            out[f"read_floor/bn{bn}w{w}/{tag}"] = lambda bn=bn, w=w, ev=ev: read_key_set(k, v, pos, N_SINK, WINDOW,
                                                                                        bn, w, ev)
    out["sdpa_compact"] = lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
    return out


x = torch.zeros(1, device="cuda")
shapes = {"floors": None, "Hq16/Hkv2/D256": (16, 2, 256), "Hq32/Hkv8/D128": (32, 8, 128)}
gen = torch.Generator(device="cuda").manual_seed(0)
for name, shape in shapes.items():
    if shape is None:
        fns = {"one_empty_kernel": lambda: x.add_(1), "two_empty_kernels": lambda: x.add_(1).add_(1)}
        checks = {}
    else:
        Hq, Hkv, D = shape
        k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
        v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        q = torch.randn(1, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, 1, D)
        pos = torch.tensor([S - 1], device="cuda")
        keep = torch.cat([torch.arange(N_SINK), torch.arange(S - WINDOW, S)]).cuda()
        kc, vc = k[:, :, keep].contiguous(), v[:, :, keep].contiguous()  # (1, Hkv, 4160, D)
        fns = targets(q, k, v, pos, kc, vc)
        outs = {t: fns[f"draft/{t}"]().clone() for t in ("normal", "evict_first")}
        ref = F.scaled_dot_product_attention(q.float(), kc.float(), vc.float(), enable_gqa=True)
        checks = {"evict_first_equal_to_normal": bool(torch.equal(outs["normal"], outs["evict_first"])),
                  "max_abs_err_vs_fp32_sdpa": float((outs["normal"].float() - ref).abs().max())}
    rounds = {t: [] for t in fns}
    for _ in range(ROUNDS):  # round-robin, so that drift hits every target alike
        for t, fn in fns.items():
            try:
                rounds[t].append(timings(fn))
            except Exception as e:  # noqa: BLE001
                rounds[t].append({"error": f"{type(e).__name__}: {e}"[:300]})
    for t, rs in rounds.items():
        row = {"shape": name, "target": t, **checks}
        if any("error" in r for r in rs):
            row["error"] = next(r["error"] for r in rs if "error" in r)
        else:
            row.update({m: round(statistics.median(r[m] for r in rs), 2) for m in rs[0]})
        res["rows"].append(row)
        print(row, flush=True)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1)
ta.EVICT = ""
