"""Tune the Triton kernel's launch options on one CUDA GPU (arXiv 2607.21535, Sec. 3 and 4).

Sweeps, for the issue's benchmark shapes (bf16, batch 1, queries at the end of the cache):

- draft: ``q_len`` 1, sink 64 + window 4096, at the largest context (its time does not depend on
  it); block size, warps, and key blocks per split (so ``num_splits``);
- verify: full causal set at the largest context, ``q_len`` 1 and 8 (Hq32/Hkv8/D128) and 8
  (Hq16/Hkv2/D256); block size, pipeline stages, and programs per SM (so ``num_splits``).

Every configuration is captured in a CUDA graph and its replay timed with
``triton.testing.do_bench`` (cold L2, median): the kernels' device time, as ``wmtp bench
attention``'s ``graph_ms``; each is checked against the launcher's defaults (max abs difference).
Results are written as JSON after every case, so a run stopped at ``--budget-s`` keeps what it
measured. The chosen defaults live in ``launch_config`` (wmtp/attention/plan.py); this script is how
they were found, not part of the library.

    python scripts/tune_attention.py --out tune.json --budget-s 240
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import torch
import triton
from triton.testing import do_bench

from wmtp.attention.triton_attention import attention_triton
from wmtp.bench_timing import capture_graph
from wmtp.fileio import atomic_path
from wmtp.metrics import environment

SHAPES = ((16, 2, 256), (32, 8, 128))  # (Hq, Hkv, D)
N_SINK, WINDOW = 64, 4096


def _inputs(S, Hq, Hkv, D, q_len, gen):
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    q = torch.randn(1, Hq, q_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, Lq, D)
    return q, k, v, torch.arange(S - q_len, S, device="cuda")


def _graph_ms(fn) -> float:
    """Median device time of ``fn`` captured in a CUDA graph, cold L2 (as ``wmtp bench attention``'s graph_ms)."""
    return float(do_bench(capture_graph(fn).replay, warmup=10, rep=30, return_mode="median"))


def _time(fn, ref) -> dict:
    try:
        diff = (fn().float() - ref.float()).abs().max().item()
        return {"graph_ms": _graph_ms(fn), "max_abs_diff": diff}
    except Exception as e:  # a configuration that does not compile or run is data
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--contexts", type=int, nargs="+", default=[16384, 1048576])
    ap.add_argument("--kinds", nargs="+", choices=("draft", "verify"), default=["draft", "verify"])
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    result = {"command": "python " + " ".join(sys.argv), "environment": environment(torch.device("cuda")),
              "n_sink": N_SINK, "window": WINDOW, "dtype": "bfloat16", "sm_count": sms, "rows": []}

    tiny = torch.zeros(1, device="cuda")  # the timing floor: a graph of one one-element kernel
    result["graph_floor_ms"] = _graph_ms(lambda: tiny.add_(1))

    def save():
        result["wall_time_s"] = time.perf_counter() - t0
        with atomic_path(args.out) as tmp, open(tmp, "w") as f:
            json.dump(result, f, indent=1)

    S_max = max(args.contexts)
    cases = [("draft", S_max, shape, 1) for shape in SHAPES if "draft" in args.kinds]  # S-independent
    if "verify" in args.kinds:
        cases += [("verify", S_max, (32, 8, 128), q_len) for q_len in (1, 8)] + [("verify", S_max, (16, 2, 256), 8)]
    for kind, S, (Hq, Hkv, D), q_len in cases:
        q, k, v, q_pos = _inputs(S, Hq, Hkv, D, q_len, gen)
        ns, w = (N_SINK, WINDOW) if kind == "draft" else (None, None)
        ref = attention_triton(q, k, v, q_pos, ns, w)
        base = {"kind": kind, "S": S, "Hq": Hq, "Hkv": Hkv, "D": D, "q_len": q_len}
        result["rows"].append(base | {"config": "defaults"} | _time(lambda: attention_triton(q, k, v, q_pos, ns, w),
                                                                     ref))
        if kind == "draft":  # per: key blocks per split
            grid = itertools.product((64, 128), (4, 8), (1, 2, 4, 8), (None, 1, 2))
        else:  # per: programs per SM
            grid = itertools.product((32, 64) if D > 128 else (64, 128), (4,), (1, 2, 4), (3, 4))
        for block_n, warps, per, stages in grid:
            if time.perf_counter() - t0 > args.budget_s:
                result["stopped"] = f"budget of {args.budget_s} s reached"
                save()
                return 0
            keys = N_SINK + WINDOW + 1 if kind == "draft" else S
            n_blk = triton.cdiv(keys, block_n) + (kind == "draft")
            splits = triton.cdiv(n_blk, per) if kind == "draft" else max(1, min(n_blk, triton.cdiv(per * sms, Hkv)))
            cfg = {"block_n": block_n, "num_warps": warps, "num_splits": splits, "num_stages": stages}
            fn = lambda: attention_triton(q, k, v, q_pos, ns, w, **cfg)  # noqa: E731
            result["rows"].append(base | {"config": cfg} | _time(fn, ref))
        save()
        best = min((r for r in result["rows"] if r.get("graph_ms") and r["S"] == S and r["kind"] == kind
                    and (r["Hq"], r["q_len"]) == (Hq, q_len)), key=lambda r: r["graph_ms"])
        dflt = next(r for r in result["rows"] if r["config"] == "defaults" and r["kind"] == kind and r["S"] == S
                    and (r["Hq"], r["q_len"]) == (Hq, q_len))
        print(f"{kind} S={S} Hq{Hq}/Hkv{Hkv}/D{D} q_len={q_len}: defaults {dflt.get('graph_ms')} ms, "
              f"best {best['graph_ms']:.4f} ms {best['config']}", flush=True)
        torch.cuda.empty_cache()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
