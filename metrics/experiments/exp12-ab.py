"""Experiment 12 (session 7): the draft's dots with A and B swapped, so that they run on wgmma.

The default kernel multiplies the (BLOCK_M = 16)-row query tile by each key block: ``s = q K^T``,
``acc += p V``. With 16 rows Triton (3.7.1, offline for sm_90, scripts/kernel_sm90.py) emits
``mma.sync`` fed by ``ldmatrix`` from shared memory. exp12-swap.patch adds ``SWAP``, which
transposes the tile: ``s^T = K q^T`` (BLOCK_N, BLOCK_M) and ``acc^T += V^T p^T`` (D, BLOCK_M), the
keys (or head dims) on the M side of the dot, as decode kernels do for small query counts: Triton
then emits ``wgmma`` (offline: D256 draft 255 registers and 2.3 KB of spills at 4 warps, 228 and
none at 8; D128 draft 154 registers at 4 warps, 113 at 8). Contiguous caches only. Run from a tree
with the patch applied:

    git apply metrics/experiments/exp12-swap.patch
    PYTHONPATH=$PWD python3 metrics/experiments/exp12-ab.py $OUT/exp12.json

Cells: drafts (q_len 1 and 8) and the verify (q_len 8) at S = 1M, bf16, both bench shapes.
Variants: default, swap, swap with 8 warps, 8 warps. Timings: ``graph_ms`` (do_bench of one graph
replay, the bar's) and ``step_ms`` (wmtp/bench_timing.py); three interleaved rounds, medians.
Outputs: ``max_abs_vs_default`` (bf16 output) and, for drafts, ``max_abs_vs_fp32`` against the
reference attention in fp32 (``attention_torch`` on fp32 copies).
"""

import json
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.attention.reference import attention_torch
from wmtp.bench_timing import capture_graph, l2_flush, step_ms
from wmtp.metrics import environment

S, N_SINK, WINDOW, ROUNDS = 1 << 20, 64, 4096, 3
OUT = sys.argv[1]
VARIANTS = {"default": (False, None), "swap": (True, None), "swap_w8": (True, 8), "w8": (False, 8)}
t0 = time.perf_counter()
dev = torch.device("cuda")
flush = l2_flush(dev)
res = {"command": "PYTHONPATH=$PWD python3 metrics/experiments/exp12-ab.py $OUT/exp12.json (with exp12-swap.patch)",
       "environment": environment(dev), "doc": __doc__, "unit": "us", "rows": []}


def graph_us(fn):
    return float(do_bench(capture_graph(fn).replay, warmup=25, rep=100, return_mode="median")) * 1e3


gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    cells, refs32 = {}, {}
    for q_len in (1, 8):
        q = torch.randn(1, Hq, q_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, Lq, D)
        pos = torch.arange(S - q_len, S, device="cuda")
        for name, window in ((f"draft q{q_len}", WINDOW), (f"verify q{q_len}", None)):
            if name == "verify q1":
                continue
            cells[name] = lambda w, q=q, pos=pos, window=window: ta.attention_triton(q, k, v, pos, N_SINK, window,
                                                                                    num_warps=w)
            if window is not None:
                lo = S - q_len - window + 1  # the recent keys of every query, and the sinks
                kk = torch.cat([k[:, :, :N_SINK], k[:, :, lo:]], 2).float()
                vv = torch.cat([v[:, :, :N_SINK], v[:, :, lo:]], 2).float()
                # the compact cache holds the same keys; positions relabelled so that the key set is unchanged
                refs32[name] = attention_torch(q.float(), kk, vv, pos - (lo - N_SINK), N_SINK, WINDOW)
                del kk, vv
    names = list(VARIANTS)
    outs, runs = {}, {(c, n): [] for c in cells for n in names}
    for r in range(ROUNDS):
        for c, fn in cells.items():
            for n in names:  # interleaved: drift hits every variant alike
                swap, warps = VARIANTS[n]
                ta.EXP12["swap"] = swap
                call = lambda fn=fn, warps=warps: fn(warps)  # noqa: E731
                row = runs[(c, n)]
                try:
                    out = call()
                    outs.setdefault((c, n), out.float())
                    st = step_ms(call, flush)
                    if isinstance(st, str):
                        raise RuntimeError(st)
                    row.append({"graph": graph_us(call), "step": st * 1e3})
                except Exception as e:  # noqa: BLE001
                    row.append({"error": f"{type(e).__name__}: {e}"[:300]})
    ta.EXP12["swap"] = False
    for (c, n), rs in runs.items():
        row = {"shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", "cell": c, "variant": n}
        if any("error" in x for x in rs):
            row["error"] = next(x["error"] for x in rs if "error" in x)
        else:
            row.update({m: round(statistics.median(x[m] for x in rs), 2) for m in rs[0]})
            row["max_abs_vs_default"] = float((outs[(c, n)] - outs[(c, "default")]).abs().max())
            if c in refs32:
                row["max_abs_vs_fp32"] = float((outs[(c, n)] - refs32[c]).abs().max())
        res["rows"].append(row)
        print(row, flush=True)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1)
    k = v = None
    torch.cuda.empty_cache()
