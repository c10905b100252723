"""Experiment 28: split-K or not for the short key ranges of the small preset's decode calls.

Experiment 27 (metrics/experiments/kernel-census-h200-exp27.json) found every attention call of a
one-row head call or a local layer as two kernels: the split programs and the log-sum-exp merge.
For float32 the planner (wmtp/attention/plan.py ``launch_config``) splits a 72-key draft range into
4 programs a kv head and a 64-key local window into 3. Here each call of the small preset's shapes
(float32, Hq = Hkv = 4, D = 64, 16K cache) is timed with the planner's splits and with 1, 2 (and
the planner's block count) splits: 20 calls captured in one CUDA graph, 50 replays, microseconds a
call (median of 5 rounds), and a graph of one call (what a decode step pays). Each output is checked
against the planner's.

Usage: python3 metrics/experiments/exp28-short-splits.py OUT.json
"""
import sys

import torch
from graph_timing import us_per_call

from wmtp.attention.plan import launch_config
from wmtp.attention.triton_attention import attention_triton
from wmtp.metrics import environment, write_json

S, B, H, D, CALLS, REPS, ROUNDS = 16384, 1, 4, 64, 20, 50, 5
dev = torch.device("cuda")
g = torch.Generator(dev).manual_seed(0)
k, v = (torch.randn(B, H, S, D, device=dev, generator=g) for _ in range(2))
sm = torch.cuda.get_device_properties(dev).multi_processor_count
cases = {"draft_1q_sink8_win64": (1, 8, 64), "extend_8q_sink8_win64": (8, 8, 64),
         "local_1q_win64": (1, 0, 64), "local_8q_win64": (8, 0, 64), "full_1q": (1, 0, None),
         "full_8q": (8, 0, None)}


def per_call_us(fn, calls):
    return us_per_call(fn, calls, REPS, ROUNDS, warm=10)


result = {"experiment": 28, "command": "python3 metrics/experiments/exp28-short-splits.py OUT.json",
          "environment": environment(dev), "S": S, "shape": {"B": B, "Hq": H, "Hkv": H, "D": D},
          "dtype": "float32", "calls_per_graph": CALLS, "replays": REPS, "rounds": ROUNDS, "cases": {}}
with torch.no_grad():
    for name, (lq, n_sink, window) in cases.items():
        q = torch.randn(B, H, lq, D, device=dev, generator=g)
        pos = torch.arange(S - lq, S, device=dev)
        cfg = launch_config(B, H, H, lq, D, torch.float32, S, n_sink, window, sm)
        ref = attention_triton(q, k, v, pos, n_sink, window)
        row = {"planner": {"num_splits": cfg.num_splits, "block_n": cfg.block_n, "num_warps": cfg.num_warps,
                           "num_stages": cfg.num_stages}, "by_splits": {}}
        for splits in sorted({None, 1, 2, 4, cfg.num_splits} - ({2, 4} if window is None else set()),
                             key=lambda s: -1 if s is None else s):
            fn = lambda: attention_triton(q, k, v, pos, n_sink, window, num_splits=splits)  # noqa: E731
            err = (fn() - ref).abs().max().item()
            row["by_splits"][str(splits)] = {"us_per_call_in_graph_of_20": per_call_us(fn, CALLS),
                                             "us_graph_of_one": per_call_us(fn, 1), "max_abs_diff": err}
        result["cases"][name] = row
        print(name, row["planner"], {s: (round(r["us_per_call_in_graph_of_20"], 2), round(r["us_graph_of_one"], 2))
                                     for s, r in row["by_splits"].items()}, flush=True)
write_json(sys.argv[1], result)
