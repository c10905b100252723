"""Where the windowed draft's device time goes on one CUDA GPU (arXiv 2607.21535, Sec. 3 and 4).

The draft bar of the kernel issue is the CUDA-graph device time of one draft call (``graph_ms`` of
``wmtp bench attention``). This script puts that time beside the floors it cannot beat, at the
benchmark's shapes (bf16, batch 1, one query at the end of a 1M-position cache, sink 64 + window
4096), every figure a median over ``--reps`` graph replays timed with CUDA events:

- ``launch``: a graph of one (and of two dependent) one-element kernels: the timing floor;
- ``read``: a Triton kernel that only reads the draft's keys and values (the window's
  ``4096 x Hkv x D`` K and V, one block per program) and writes one number per program: the
  memory floor of the one-kernel, one-block-per-program shape;
- ``draft``: ``attention_triton`` with its defaults and with launch overrides (block size, warps,
  one pipeline stage, programmatic dependent launch of the merge on and off: NOTE [PDL]).

Each is timed three ways: ``cold_dirty`` (before each replay a 256 MB buffer is zeroed, as
``triton.testing.do_bench`` does, so L2 holds dirty lines that the kernel's reads must write
back: the bench's ``graph_ms`` method), ``cold_clean`` (a 256 MB buffer is read instead: L2
holds clean lines) and ``warm`` (no flush: the draft's 9-17 MB stay in the 60 MB L2; ten replays
back to back a sample, so a host slower than the device still shows). The default draft is also
timed as its two kernels apart (attention grid alone, merge alone), and its plain call on the host
(``host``: Python launcher and Triton launches, with a cProfile summary on stdout).

    python scripts/draft_floor.py --out draft-floor.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from wmtp.attention import triton_attention as ta  # (wmtp.attention is also a function name)
from wmtp.attention.triton_attention import attention_triton
from wmtp.bench_timing import capture_graph
from wmtp.fileio import atomic_path
from wmtp.metrics import environment

SHAPES = ((16, 2, 256), (32, 8, 128))  # (Hq, Hkv, D)
N_SINK, WINDOW, S = 64, 4096, 1 << 20


@triton.jit
def _one(X):
    tl.store(X + tl.program_id(0), 1.0)


@triton.jit
def _read(K, V, QPOS, Out, stride_kh, stride_kpos, window, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Read one block of the window of K and V (as the draft does: position loaded first) and reduce it."""
    h, blk = tl.program_id(0), tl.program_id(1)
    t = tl.load(QPOS)
    kpos = t - window + 1 + blk * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    off = h * stride_kh + kpos.to(tl.int64)[:, None] * stride_kpos + tl.arange(0, D)[None, :]  # (BLOCK_N, D)
    k = tl.load(K + off)
    v = tl.load(V + off)
    tl.store(Out + h * tl.num_programs(1) + blk, tl.sum(k.to(tl.float32) + v.to(tl.float32)))


def _times(fn, reps: int, flush_buf: torch.Tensor, sink: torch.Tensor) -> dict:
    """Median microseconds of ``fn``'s graph replay under three L2 states."""
    g = capture_graph(fn)
    out = {}
    for mode in ("cold_dirty", "cold_clean", "warm"):
        ts = []
        for _ in range(reps):
            if mode == "cold_dirty":
                flush_buf.zero_()
            elif mode == "cold_clean":
                sink.copy_(flush_buf.sum(dtype=torch.int64))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            n = 10 if mode == "warm" else 1  # warm: 10 back-to-back replays a sample (the host may still lag)
            start.record()
            for _ in range(n):
                g.replay()
            end.record()
            end.synchronize()
            ts.append(start.elapsed_time(end) * 1000 / n)
        out[mode] = round(statistics.median(ts), 2)
    return out


def _breakdown(row, shape, call):
    """The default draft's two kernels timed apart: the attention grid alone (the merge launch made a
    no-op), then the merge alone on the partials that call left (its launch arguments captured)."""
    captured = []
    real = ta.launch_merge
    ta.launch_merge = lambda *a, **kw: captured.append((a, kw))
    try:
        row("draft attention kernel alone", call, shape=shape)
    finally:
        ta.launch_merge = real
    if captured:
        a, kw = captured[-1]
        row("draft merge kernel alone", lambda: real(*a, **kw), shape=shape)


def _host(call, shape: str, n: int = 300) -> dict:
    """Host microseconds of one plain call (the Python launcher, two Triton launches), median of ``n``
    with the device drained between calls; the cProfile top entries by own time go to stdout."""
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        call()
        ts.append((time.perf_counter() - t) * 1e6)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        call()
    prof.disable()
    torch.cuda.synchronize()
    print(f"host profile, {shape}, 100 calls:")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return {"shape": shape, "host_us_median": round(statistics.median(ts), 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    flush_buf = torch.empty(64 << 20, dtype=torch.int32, device="cuda")  # 256 MB
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    result = {"command": "python " + " ".join(sys.argv), "environment": environment(torch.device("cuda")),
              "unit": "us", "n_sink": N_SINK, "window": WINDOW, "S": S, "rows": [], "host": []}

    def row(name, fn, **meta):
        try:
            r = {"name": name} | meta | _times(fn, args.reps, flush_buf, sink)
        except Exception as e:  # a launch that does not compile or run is data
            r = {"name": name} | meta | {"error": f"{type(e).__name__}: {e}"[:300]}
        result["rows"].append(r)
        print(r, flush=True)

    x = torch.zeros(1024, device="cuda")
    # a warm-up, discarded: without it the first row of draft-floor-h200-2fb54d7.json read 12.45 us cold_dirty
    _times(lambda: _one[(1,)](x), 20, flush_buf, sink)  # (2.8-3.1 us in the idle runs before; not yet run with it)
    row("launch x1", lambda: _one[(1,)](x))
    row("launch x2", lambda: (_one[(1,)](x), _one[(1,)](x)))
    row("launch x1, 272 programs", lambda: _one[(272,)](x))
    gen = torch.Generator(device="cuda").manual_seed(0)
    for Hq, Hkv, D in SHAPES:
        shape = f"Hq{Hq}/Hkv{Hkv}/D{D}"
        k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
        v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
        q = torch.randn(1, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, 1, D)
        pos = torch.tensor([S - 1], device="cuda")
        for bn, warps in ((64, 4), (128, 4), (128, 8), (32, 2), (32, 4), (32, 8), (16, 4)):
            red = torch.empty(Hkv * WINDOW // bn, device="cuda")
            row("read", lambda: _read[(Hkv, WINDOW // bn)](k, v, pos, red, k.stride(1), k.stride(2), WINDOW,
                                                           BLOCK_N=bn, D=D, num_warps=warps),
                shape=shape, block_n=bn, num_warps=warps)
        ref = attention_triton(q, k, v, pos, N_SINK, WINDOW, pdl=False)
        row("draft defaults", lambda: attention_triton(q, k, v, pos, N_SINK, WINDOW), shape=shape)
        _breakdown(row, shape, lambda: attention_triton(q, k, v, pos, N_SINK, WINDOW))
        result["host"].append(_host(lambda: attention_triton(q, k, v, pos, N_SINK, WINDOW), shape))
        configs = [dict(block_n=bn, num_warps=w, num_stages=1, pdl=True) for bn in (32, 64, 128) for w in (4, 8)]
        configs += [dict(block_n=bn, num_warps=4, num_stages=1, pdl=False) for bn in (32, 64, 128)]
        for cfg in configs:
            fn = lambda: attention_triton(q, k, v, pos, N_SINK, WINDOW, **cfg)  # noqa: E731
            try:
                diff = (fn().float() - ref.float()).abs().max().item()
            except Exception as e:
                diff = f"{type(e).__name__}: {e}"[:200]
            row("draft", fn, shape=shape, max_abs_diff=diff, **cfg)
        result["wall_time_s"] = round(time.perf_counter() - t0, 1)
        with atomic_path(args.out) as tmp, open(tmp, "w") as f:
            json.dump(result, f, indent=1)
    for shape in (f"Hq{Hq}/Hkv{Hkv}/D{D}" for Hq, Hkv, D in SHAPES):  # summary: fastest first, cold_dirty
        rows = sorted((r for r in result["rows"] if r.get("shape") == shape and "cold_dirty" in r),
                      key=lambda r: r["cold_dirty"])
        print(shape, *rows[:8], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
