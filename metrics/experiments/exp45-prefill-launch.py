"""Experiment 45: a prefill's attention in ONE launch a layer (NOTE [Chunks] in
wmtp/attention/triton_attention.py) against one launch a chunk of queries (the code before it),
side by side in one run.

The small preset's target and head (random weights: the timing does not depend on them), float32
as ``wmtp bench batch`` decodes, run ``wmtp.rows.prefill_rows`` (the target over B prompts of P
tokens, then the head over their true chains) with ``impl="triton"``. ``per_chunk`` patches the
launcher to cut the queries into chunks of ``query_chunk`` and launch each chunk alone, as
``by_query_chunks`` did before; ``one_launch`` is the committed code. Per (P, B) and round the two
run back to back (order alternating), each timed wall-clock after a synchronize; one untimed
warm-up each first (compilation). Reported: medians, ms a prompt, the speedup of one_launch
(per_chunk / one_launch - 1), whether the first new tokens agree and the largest difference of
the last hidden states. For B = 1 at the largest P, a torch.profiler pass of each mode counts the
GPU kernels and sums their busy time.

Usage: python3 metrics/experiments/exp45-prefill-launch.py OUT.json DEVICE ROUNDS [P ...]
"""

import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import wmtp
from wmtp.attention import triton_attention as ta
from wmtp.attention.plan import query_chunk
from wmtp.device import synchronize
from wmtp.metrics import environment, write_json
from wmtp.rows import prefill_rows

out, device, ROUNDS = sys.argv[1], torch.device(sys.argv[2]), int(sys.argv[3])
LENGTHS = [int(p) for p in sys.argv[4:]] or [1024, 16384]
BATCHES = [1, 4, 16]
target, head = wmtp.build_models("small", seed=0)
target, head = target.to(device, torch.float32).eval(), head.to(device, torch.float32).eval()
one_launch = ta._launch


def per_chunk(q, q_sink, k, v, block_table, page_size, q_pos, n_sink, window, tuning):
    """The launcher before NOTE [Chunks]: one launch (and merge) a chunk of queries."""
    Hkv = k.shape[1] if block_table is None else k.shape[2]
    Lc = query_chunk(q.shape[2], q.shape[1] // Hkv, q.dtype, q.shape[-1])
    if Lc >= q.shape[2]:
        return one_launch(q, q_sink, k, v, block_table, page_size, q_pos, n_sink, window, tuning)
    return torch.cat([one_launch(q[:, :, i: i + Lc], None if q_sink is None else q_sink[:, :, i: i + Lc], k, v,
                                 block_table, page_size, q_pos[..., i: i + Lc], n_sink, window, tuning)
                      for i in range(0, q.shape[2], Lc)], dim=2)


MODES = {"one_launch": one_launch, "per_chunk": per_chunk}


def run(mode, rows, P):
    ta._launch = MODES[mode]
    try:
        with torch.no_grad():
            synchronize(device)
            t0 = time.perf_counter()
            _, _, x, h, _ = prefill_rows(target, head, rows, P, "triton")
            synchronize(device)
            return time.perf_counter() - t0, x, h
    finally:
        ta._launch = one_launch


def profiled(mode, rows, P) -> dict:
    """GPU kernels launched by one prefill and their summed busy time (torch.profiler)."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall, _, _ = run(mode, rows, P)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us()
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:6]
    return {"wall_ms": wall * 1e3, "kernels": len(kernels), "kernel_busy_ms": sum(by_name.values()) / 1e3,
            "top_kernels_ms": {name[:80]: us / 1e3 for name, us in top}}


gen = torch.Generator().manual_seed(45)
result = {"experiment": 45, "command": " ".join(["python3", sys.argv[0], "OUT.json", *sys.argv[2:]]),
          "environment": environment(device), "preset": "small", "dtype": "float32", "weights": "random (seed 0)",
          "rounds": ROUNDS, "warmup_rounds": 1, "rows": []}
for P in LENGTHS:
    for B in BATCHES:
        rows = list(torch.randint(0, target.config.vocab_size, (B, P), generator=gen).to(device))
        seconds = {m: [] for m in MODES}
        outs = {m: run(m, rows, P)[1:] for m in MODES}  # warm-up: compiles
        for r in range(ROUNDS):
            for m in (MODES if r % 2 == 0 else reversed(list(MODES))):
                seconds[m].append(run(m, rows, P)[0])
        med = {m: statistics.median(s) for m, s in seconds.items()}
        row = {"prompt_tokens": P, "batch": B, "seconds_rounds": seconds,
               "median_ms": {m: v * 1e3 for m, v in med.items()},
               "median_ms_a_prompt": {m: v * 1e3 / B for m, v in med.items()},
               "speedup_one_launch": med["per_chunk"] / med["one_launch"] - 1,
               "first_tokens_equal": bool(torch.equal(outs["one_launch"][0], outs["per_chunk"][0])),
               "hidden_max_abs_diff": float((outs["one_launch"][1] - outs["per_chunk"][1]).abs().max())}
        if B == 1 and P == max(LENGTHS):
            row["profile"] = {m: profiled(m, rows, P) for m in MODES}
        result["rows"].append(row)
        print(P, B, {m: round(v, 2) for m, v in row["median_ms"].items()}, f"speedup {row['speedup_one_launch']:+.1%}",
              "tokens equal" if row["first_tokens_equal"] else "TOKENS DIFFER", flush=True)
write_json(out, result)
