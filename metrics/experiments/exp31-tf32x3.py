"""Experiment 31: float32 attention with the dots as three TF32 tensor-core products (``tf32x3``)
instead of IEEE FMA loops, for the small preset's calls on the H200.

Experiments 28 and 29 found the float32 full-attention calls far from the bandwidth floor (48 us a
call where 16K keys' bytes take 7 us): the kernel's float32 dots run without tensor cores
(``PRECISION="ieee"``, wmtp/attention/triton_plan.py). Triton's ``tf32x3`` splits each float32
operand into a TF32 high part and a TF32 remainder and adds three tensor-core products, close to
float32 accuracy. Here each call (float32, Hq = Hkv = 4, D = 64, the small preset's) runs with
the committed ``ieee`` dots and with ``tf32x3`` (and plain ``tf32`` for scale), patched into the
kernel's plan with the plan and launch caches cleared between variants: microseconds a call in a
CUDA graph of one call and of 20 calls (medians of 5 rounds), and the error against the float64
reference beside the float32 reference's error, with NOTE [Tolerances]'s kernel rule
(tests/attention_truth.py: max error <= 2 x the reference's + 1e-5, relative RMS <= 2 x the
reference's + 1e-6) evaluated.

Usage: python3 metrics/experiments/exp31-tf32x3.py OUT.json
"""
import sys

import graph_timing
import torch

from wmtp.attention import triton_attention, triton_merge, triton_plan
from wmtp.attention.reference import attention_torch
from wmtp.attention.triton_attention import attention_triton
from wmtp.metrics import environment, write_json

B, H, D, REPS, ROUNDS = 1, 4, 64, 50, 5
VARIANTS = ("ieee", "tf32x3", "tf32")
CASES = {"full_1q": (1, 0, None), "full_8q": (8, 0, None), "draft_1q_sink8_win64": (1, 8, 64),
         "extend_8q_sink8_win64": (8, 8, 64), "local_8q_win64": (8, 0, 64)}
dev = torch.device("cuda")
plain_plan = triton_plan._static_plan


def use(precision: str) -> None:
    def patched(*a, **kw):
        p = plain_plan(*a, **kw)
        if p.kwargs["PRECISION"] == "ieee" and a[8] == torch.float32:  # float32 only; float64 stays ieee
            p = p._replace(kwargs={**p.kwargs, "PRECISION": precision})
        return p
    triton_plan._static_plan = patched
    plain_plan.cache_clear()
    triton_attention._ATTENTION.kernels.clear()
    triton_merge._MERGE.kernels.clear()


def us_per_call(fn, calls):
    return graph_timing.us_per_call(fn, calls, REPS, ROUNDS, warm=5)


result = {"experiment": 31, "command": "python3 metrics/experiments/exp31-tf32x3.py OUT.json",
          "environment": environment(dev), "shape": {"B": B, "Hq": H, "Hkv": H, "D": D}, "dtype": "float32",
          "replays": REPS, "rounds": ROUNDS, "variants": list(VARIANTS), "cases": []}
g = torch.Generator(dev).manual_seed(0)
with torch.no_grad():
    for S in (16384, 131072):
        k, v = (torch.randn(B, H, S, D, device=dev, generator=g) for _ in range(2))
        calls = {}
        for name, (lq, n_sink, window) in CASES.items():
            q = torch.randn(B, H, lq, D, device=dev, generator=g) * 2
            pos = torch.arange(S - lq, S, device=dev)
            truth = attention_torch(q.double(), k.double(), v.double(), pos, n_sink, window)
            ref = attention_torch(q, k, v, pos, n_sink, window).double() - truth
            calls[name] = (q, pos, n_sink, window, truth)
            result["cases"].append({"S": S, "case": name, "Lq": lq, "n_sink": n_sink, "window": window,
                                    "ref_max_err": ref.abs().max().item(),
                                    "ref_rel_rms": (ref.norm() / truth.norm()).item(), "variants": {}})
        for variant in VARIANTS:
            use(variant)
            for row in (r for r in result["cases"] if r["S"] == S):
                q, pos, n_sink, window, truth = calls[row["case"]]
                fn = lambda: attention_triton(q, k, v, pos, n_sink, window)  # noqa: E731
                err = fn().double() - truth
                max_err, rms = err.abs().max().item(), (err.norm() / truth.norm()).item()
                row["variants"][variant] = r = {
                    "us_graph_of_one": us_per_call(fn, 1), "us_per_call_in_graph_of_20": us_per_call(fn, 20),
                    "max_err": max_err, "rel_rms": rms,
                    "passes_kernel_rule": max_err <= 2 * row["ref_max_err"] + 1e-5
                    and rms <= 2 * row["ref_rel_rms"] + 1e-6}
                print(S, row["case"], variant, round(r["us_graph_of_one"], 2),
                      round(r["us_per_call_in_graph_of_20"], 2),
                      f"err {max_err:.2e} ref {row['ref_max_err']:.2e} rule {r['passes_kernel_rule']}", flush=True)
            write_json(sys.argv[1], result)
use("ieee")
