"""Experiment 29: the float32 full-attention launch of the small preset's decode calls, swept.

Experiment 28 (metrics/experiments/short-splits-h200-exp28.json) timed the full causal set over a
16K cache at 48 us a call for one query and 54 us for eight (float32, Hq = Hkv = 4, D = 64): 33.5 MB
of keys and values, 7 us at the H200's bandwidth. Here the same calls, and 131072 keys, under other
launches: block_n, num_warps, num_stages and splits (None: the planner's). Timing as experiment 28
(20 calls in one CUDA graph, 50 replays, median of 3 rounds, us a call); outputs checked against the
planner's launch.

Usage: python3 metrics/experiments/exp29-fp32-full-sweep.py OUT.json
"""
import itertools
import sys

import torch
from graph_timing import us_per_call

from wmtp.attention.plan import launch_config
from wmtp.attention.triton_attention import attention_triton
from wmtp.metrics import environment, write_json

B, H, D, CALLS, REPS, ROUNDS = 1, 4, 64, 20, 50, 3
dev = torch.device("cuda")
g = torch.Generator(dev).manual_seed(0)
sm = torch.cuda.get_device_properties(dev).multi_processor_count


def per_call_us(fn):
    return us_per_call(fn, CALLS, REPS, ROUNDS, warm=5)


result = {"experiment": 29, "command": "python3 metrics/experiments/exp29-fp32-full-sweep.py OUT.json",
          "environment": environment(dev), "shape": {"B": B, "Hq": H, "Hkv": H, "D": D}, "dtype": "float32",
          "calls_per_graph": CALLS, "replays": REPS, "rounds": ROUNDS, "cases": []}
with torch.no_grad():
    for S in (16384, 131072):
        k, v = (torch.randn(B, H, S, D, device=dev, generator=g) for _ in range(2))
        for lq in (1, 8):
            q = torch.randn(B, H, lq, D, device=dev, generator=g)
            pos = torch.arange(S - lq, S, device=dev)
            cfg = launch_config(B, H, H, lq, D, torch.float32, S, 0, None, sm)
            ref = attention_triton(q, k, v, pos)
            rows = []
            for bn, warps, stages, splits in itertools.product((32, 64, 128), (2, 4, 8), (2, 3), (None, 128)):
                kw = dict(block_n=bn, num_warps=warps, num_stages=stages, num_splits=splits)
                try:
                    fn = lambda: attention_triton(q, k, v, pos, **kw)  # noqa: E731
                    err = (fn() - ref).abs().max().item()
                    rows.append(kw | {"us": per_call_us(fn), "max_abs_diff": err})
                except Exception as e:  # a launch out of shared memory or registers
                    rows.append(kw | {"error": f"{type(e).__name__}: {e}"[:200]})
            planner = per_call_us(lambda: attention_triton(q, k, v, pos))
            best = min((r for r in rows if "us" in r), key=lambda r: r["us"])
            result["cases"].append({"S": S, "Lq": lq, "planner": cfg._asdict() | {"us": planner}, "best": best,
                                    "nominal_floor_us_at_4.8_TBps": 2 * B * H * S * D * 4 / 4.8e12 * 1e6, "rows": rows})
            print(S, lq, "planner", cfg, round(planner, 2), "best", best, flush=True)
            write_json(sys.argv[1], result)
