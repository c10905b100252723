"""Experiment 27: every kernel of a CUDA-graph decode call after the norm and RoPE kernels
(wmtp/rmsnorm.py, wmtp/rope.py), to pick the next fusion. Experiment 17's cases and settings (preset
small, float32, 16K context, random weights: the times do not depend on them), each captured once and
replayed under torch.profiler; per kernel name: launches and device us per replay, all of them.

Usage: python3 metrics/experiments/exp27-kernel-census.py OUT.json
"""
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import wmtp
from wmtp.bench_common import with_capacity
from wmtp.device import capture_graph
from wmtp.metrics import environment, write_json

target, head = wmtp.build_models("small", seed=0)
S, K, REPS = 16384, 7, 10
target, head = with_capacity(target.cuda().float(), head.cuda().float(), S + 64)
dev = torch.device("cuda")
tc, dc = target.new_cache(1, S + 64, checked=False), head.new_cache(1, S + 64, checked=False)
ids = torch.randint(0, 4096, (S,), device=dev, generator=torch.Generator(dev).manual_seed(0))
result = {"experiment": 27, "command": "python3 metrics/experiments/exp27-kernel-census.py OUT.json",
          "environment": environment(dev), "S": S, "cases": {}}
with torch.no_grad():
    _, hidden = target(ids[None], torch.arange(S, device=dev), tc, "triton")
    head(hidden, ids[None], torch.arange(S, device=dev), dc, 8, 64, "triton")
    one, pos1 = ids[-1:].view(1, 1), torch.tensor([S - 1], device=dev)
    toks, hK = ids[-K - 1:][None], hidden[:, -K - 1:]
    posK = torch.tensor([S - K - 1], device=dev) + torch.arange(K + 1, device=dev)
    cases = {
        "dense_step": lambda: target(one, pos1, tc, "triton"),
        "verify_phase_target": lambda: target(toks, posK, tc, "triton"),
        "head_extend_8rows_sink8win64": lambda: head(hK, toks, posK, dc, 8, 64, "triton"),
        "head_1row_sink8win64": lambda: head(hK[:, :1], toks[:, :1], pos1, dc, 8, 64, "triton"),
    }
    for name, fn in cases.items():
        g = capture_graph(fn)
        for _ in range(20):
            g.replay()
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        for _ in range(50):
            g.replay()
        ev[1].record()
        torch.cuda.synchronize()
        us, n = defaultdict(float), defaultdict(int)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPS):
                g.replay()
            torch.cuda.synchronize()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                us[e.name[:110]] += e.device_time / REPS
                n[e.name[:110]] += 1
        kernels = sorted(us, key=lambda k: -us[k])
        result["cases"][name] = {"replay_us": ev[0].elapsed_time(ev[1]) / 50 * 1e3,
                                 "kernels_per_replay": sum(n.values()) / REPS, "kernel_us_sum": sum(us.values()),
                                 "kernels": [[k, n[k] / REPS, round(us[k], 2)] for k in kernels]}
        c = result["cases"][name]
        print(f"{name}: replay {c['replay_us']:.1f} us, {c['kernels_per_replay']:.0f} kernels, "
              f"sum {c['kernel_us_sum']:.1f} us", flush=True)
        for k, cnt, t in c["kernels"]:
            print(f"    {cnt:4.0f} x {t:8.2f} us  {k}")
write_json(sys.argv[1], result)
