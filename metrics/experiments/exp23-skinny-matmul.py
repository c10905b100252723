"""Experiment 23: a few-row float32 ``F.linear`` on the H200, the way the verify pass and the draft's
extend call it (experiment 17 profiled the verify phase at 16384 tokens: cuBLAS's FFMA GEMM kernels
took 770 of its 1284 µs for 8 rows, where a 1-row step's gemv took 68 µs for all its matmuls).

For each shape of the small preset (d_model 256, d_ff 512, vocab 4096; out x in) and each row count
M, the median time of one call, each variant captured 50 times in one CUDA graph and the graph
replayed 20 times (µs = replay / 50), and the largest difference from a float64 ``F.linear``:

- ``linear``: ``F.linear(x, w)``, as wmtp/model.py calls it (TF32 off, PyTorch's default);
- ``wT_x``: ``(w @ x.T).T``, the same product with the weight as the GEMM's tall operand;
- ``rows_bmm``: ``torch.matmul(x[:, None, :], w.T)``, meant as one gemv-shaped product per row
  (PyTorch folds the broadcast back into the same GEMM: its times are ``linear``'s);
- ``per_row``: one ``F.linear`` per row (M gemv launches), ``torch.cat`` of them;
- ``triton_bn16``, ``triton_bn32``: a Triton kernel (below) that gives each program ``BN`` output
  columns for all M <= 16 rows, exact float32 products (``input_precision="ieee"``);
- ``tf32``: ``F.linear`` with TF32 allowed (not lossless-safe: for reference only);
- ``lt``: ``F.linear`` with ``torch.backends.cuda.preferred_blas_library("cublaslt")``;
- ``zero_bias``, ``zero_bias_3d``: ``F.linear(x, w, zeros)`` on ``(M, in)`` and ``(1, M, in)`` inputs:
  with a bias PyTorch computes ``addmm(bias, x, w.T)``, which it hands to cuBLASLt (for more
  than one row), no process-wide setting needed.

Usage: python3 metrics/experiments/exp23-skinny-matmul.py OUT.json [ROWS ...]   (default rows: 1 2 4 8 16)
"""

import json
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from wmtp.metrics import environment


@triton.jit
def _skinny(x_ptr, w_ptr, out_ptr, M, N, K, sxm, swn, som,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        xk = tl.load(x_ptr + rm[:, None] * sxm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        wk = tl.load(w_ptr + rn[:, None] * swn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)
        acc += tl.dot(xk, tl.trans(wk), input_precision="ieee")
    tl.store(out_ptr + rm[:, None] * som + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def skinny(x, w, bn):
    m, k = x.shape
    n = w.shape[0]
    assert m <= 16, "one program holds BM = 16 rows"
    out = torch.empty(m, n, device=x.device, dtype=torch.float32)
    _skinny[(triton.cdiv(n, bn),)](x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), BM=16, BN=bn, BK=64)
    return out

dev = torch.device("cuda")
SHAPES = {"qkvo 256x256": (256, 256), "gate/up 512x256": (512, 256), "down 256x512": (256, 512),
          "lm head 4096x256": (4096, 256), "mtp proj 256x512": (256, 512)}
ROWS = tuple(int(r) for r in sys.argv[2:]) or (1, 2, 4, 8, 16)
CALLS, REPLAYS = 50, 20


def variants(x, w):
    zero = torch.zeros(w.shape[0], device=w.device, dtype=w.dtype)
    return {
        "zero_bias": lambda: F.linear(x, w, zero),
        "zero_bias_3d": lambda: F.linear(x[None], w, zero)[0],
        "linear": lambda: F.linear(x, w),
        "wT_x": lambda: (w @ x.T).T,
        "rows_bmm": lambda: torch.matmul(x[:, None, :], w.T)[:, 0],
        "per_row": lambda: torch.cat([F.linear(x[i:i + 1], w) for i in range(x.shape[0])]),
        "triton_bn16": lambda: skinny(x, w, 16),
        "triton_bn32": lambda: skinny(x, w, 32),
    }


def timed(fn) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS)
    return statistics.median(times)


gen = torch.Generator().manual_seed(0)
result = {"experiment": 23, "command": " ".join(["python3", *sys.argv[:1], "OUT.json", *sys.argv[2:]]),
          "environment": environment(dev), "calls_per_graph": CALLS, "replays": REPLAYS, "rows": []}
for name, (n_out, n_in) in SHAPES.items():
    w = (torch.randn(n_out, n_in, generator=gen) / n_in ** 0.5).to(dev)
    for m in ROWS:
        x = torch.randn(m, n_in, generator=gen).to(dev)
        ref = F.linear(x.double(), w.double())
        row = {"shape": name, "out": n_out, "in": n_in, "rows": m, "us": {}, "max_abs_diff": {}}
        for v, fn in variants(x, w).items():
            row["us"][v] = timed(fn)
            row["max_abs_diff"][v] = float((fn().double() - ref).abs().max())
        torch.backends.cuda.matmul.allow_tf32 = True
        row["us"]["tf32"] = timed(lambda: F.linear(x, w))
        row["max_abs_diff"]["tf32"] = float((F.linear(x, w).double() - ref).abs().max())
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.preferred_blas_library("cublaslt")
        row["us"]["lt"] = timed(lambda: F.linear(x, w))
        row["max_abs_diff"]["lt"] = float((F.linear(x, w).double() - ref).abs().max())
        torch.backends.cuda.preferred_blas_library("cublas")
        result["rows"].append(row)
        print(name, m, {k: round(v, 2) for k, v in row["us"].items()}, flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(result, f, indent=2)
