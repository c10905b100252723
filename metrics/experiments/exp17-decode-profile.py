"""Experiment 17: where a CUDA-graph decode step's device time goes (wmtp bench decode, preset small,
float32, 16K context): the kernels of one dense one-token step, one draft phase and one verify phase,
each replayed under torch.profiler; per kernel name, total device us per replay. Random weights (the
times do not depend on them). Usage: python3 metrics/experiments/exp17-decode-profile.py OUT.json"""
import json
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import wmtp
from wmtp.bench_decode import with_capacity
from wmtp.device import capture_graph
from wmtp.metrics import environment

torch.manual_seed(0)
target, head = wmtp.build_models("small", seed=0)
S, K = 16384, 7
target, head = with_capacity(target.cuda().float(), head.cuda().float(), S + 64)
dev = torch.device("cuda")
tc, dc = target.new_cache(1, S + 64, checked=False), head.new_cache(1, S + 64, checked=False)
ids = torch.randint(0, 4096, (S,), device=dev)
with torch.no_grad():
    _, hidden = target(ids[None], torch.arange(S, device=dev), tc, "triton")
    head(hidden, ids[None], torch.arange(S, device=dev), dc, 8, 64, "triton")
    one, pos1 = ids[-1:].view(1, 1), torch.tensor([S - 1], device=dev)
    rows = torch.arange(K + 1, device=dev)
    toks, hK = ids[-K - 1:][None], hidden[:, -K - 1:]
    posK = torch.tensor([S - K - 1], device=dev) + rows
    q1, q8 = torch.randn(1, 4, 1, 64, device=dev), torch.randn(1, 4, 8, 64, device=dev)
    cases = {
        "dense_step": lambda: target(one, pos1, tc, "triton"),
        "verify_phase_target": lambda: target(toks, posK, tc, "triton"),
        "head_extend_8rows_sink8win64": lambda: head(hK, toks, posK, dc, 8, 64, "triton"),
        "head_1row_sink8win64": lambda: head(hK[:, :1], toks[:, :1], pos1, dc, 8, 64, "triton"),
        "head_1row_native": lambda: head(hK[:, :1], toks[:, :1], pos1, dc, 0, None, "triton"),
        "attention_1q_full": lambda: wmtp.attention(q1, tc.k[1], tc.v[1], pos1),
        "attention_8q_full": lambda: wmtp.attention(q8, tc.k[1], tc.v[1], posK),
        "attention_8q_local64": lambda: wmtp.attention(q8, tc.k[0], tc.v[0], posK, 0, 64),
    }
    result = {"command": "python3 metrics/experiments/exp17-decode-profile.py", "environment": environment(dev),
              "S": S, "cases": {}}
    for name, fn in cases.items():
      try:
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
        per = defaultdict(float)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                g.replay()
            torch.cuda.synchronize()
        n_kernels = 0
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                per[e.name[:90]] += e.device_time / 10
                n_kernels += 1
        top = sorted(per.items(), key=lambda kv: -kv[1])[:12]
        result["cases"][name] = {"replay_us": ev[0].elapsed_time(ev[1]) / 50 * 1e3,
                                 "kernels_per_replay": n_kernels / 10, "kernel_us_sum": sum(per.values()),
                                 "top": [[k, round(v, 2)] for k, v in top]}
        c = result["cases"][name]
        print(f"{name}: replay {c['replay_us']:.1f} us, {c['kernels_per_replay']:.0f} kernels, "
              f"sum {c['kernel_us_sum']:.1f} us")
        for k, v in top[:6]:
            print(f"    {v:8.2f}  {k}")
      except Exception as e:
        result["cases"][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(name, result["cases"][name])
      json.dump(result, open(sys.argv[1], "w"), indent=1)
