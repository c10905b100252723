"""Experiment 15 (session 8): the launcher's host time before and after the NOTE [Workspace] trims.

Session 8 cut the Python launcher of one Triton attention call (attention/triton_plan.py NOTE
[Workspace]): one workspace pointer for the split partials instead of three views, the merge's
launch planned with the attention's, the launch cache keying only the caller's tensors, and no
transposed views of the cache. On the 2-core x86_64 CPU, with the two Triton launches faked (a
runner that reads every tensor's data pointer), ``attention_triton`` of the one-query draft went
from 26.3 to 19.0 us a call. This script measures the real thing on an H200's host, alternating
two source trees in separate processes (``label=path`` pairs; each path is put first on
``sys.path``), ``ROUNDS`` times each:

    PYTHONPATH=$PWD python3 metrics/experiments/exp15-host.py $OUT/exp15.json before=<old tree> after=$PWD

Per tree and bench shape, at S = 1M (bf16, ``q_len`` 1, 64 sinks + 4096 window): ``per_call_us``,
host time a call back to back without a sync (median of 7 runs of 500 calls) for
``attention_triton`` and the public ``wmtp.attention``; ``host_us``, the bench's ``host_ms`` (the
device idle before each call); ``plain_us``, ``do_bench`` of the plain call (the bench's
``median_ms``, which zeroes 256 MB before each call); ``graph_us``, ``do_bench`` of one graph
replay (the bench's ``graph_ms``: device time, which the trims should not move). The two trees'
outputs are compared by ``torch.equal`` through a saved file.
"""

import json
import os
import statistics
import subprocess
import sys
import time

S, N_SINK, WINDOW, CALLS, RUNS, ROUNDS = 1 << 20, 64, 4096, 500, 7, 3


def child(label: str, out_file: str) -> None:
    import torch
    from triton.testing import do_bench

    import wmtp
    from wmtp.attention import triton_attention as ta
    from wmtp.bench_timing import capture_graph, host_ms

    dev = torch.device("cuda")
    res, outs = {}, {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
        k = torch.randn(1, Hkv, S, D, device=dev, dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
        v = torch.randn(1, Hkv, S, D, device=dev, dtype=torch.bfloat16, generator=gen)
        q = torch.randn(1, Hq, 1, D, device=dev, dtype=torch.bfloat16, generator=gen)  # (1, Hq, 1, D)
        pos = torch.tensor([S - 1], device=dev)
        fns = {"attention_triton": lambda: ta.attention_triton(q, k, v, pos, N_SINK, WINDOW),
               "wmtp.attention": lambda: wmtp.attention(q, k, v, pos, N_SINK, WINDOW, impl="triton")}
        cell = {}
        for name, fn in fns.items():
            fn()
            runs = []
            for _ in range(RUNS):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(CALLS):
                    fn()
                runs.append((time.perf_counter() - t0) / CALLS * 1e6)
            torch.cuda.synchronize()
            cell[name] = {"per_call_us": round(statistics.median(runs), 2),
                          "host_us": round(host_ms(fn, dev, calls=50) * 1e3, 2),
                          "plain_us": round(do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3, 2)}
        cell["graph_us"] = round(do_bench(capture_graph(fns["attention_triton"]).replay, warmup=25, rep=100,
                                          return_mode="median") * 1e3, 2)
        res[f"Hq{Hq}/Hkv{Hkv}/D{D}"] = cell
        outs[D] = fns["attention_triton"]().cpu()
        k = v = None
        torch.cuda.empty_cache()
    torch.save(outs, out_file)
    print(json.dumps({"label": label, "wmtp_file": wmtp.__file__, "cells": res}))


def main(path: str, trees: list[str]) -> None:
    t0 = time.perf_counter()
    sys.path.insert(0, os.getcwd())
    import torch

    from wmtp.metrics import environment

    labels = dict(t.split("=", 1) for t in trees)
    res = {"command": "PYTHONPATH=$PWD python3 metrics/experiments/exp15-host.py $OUT/exp15.json "
                      + " ".join(trees), "doc": __doc__, "environment": environment("cuda"), "unit": "us",
           "rounds": []}
    for r in range(ROUNDS):
        for label, tree in (labels.items() if r % 2 == 0 else reversed(labels.items())):  # alternating order
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            run = subprocess.run([sys.executable, __file__, "--child", label, f"/tmp/exp15-{label}.pt"], env=env,
                                 capture_output=True, text=True, timeout=300)
            if run.returncode:
                res["rounds"].append({"label": label, "error": run.stderr[-1500:]})
            else:
                res["rounds"].append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(json.dumps(res["rounds"][-1])[:1500], flush=True)
    ok = [x for x in res["rounds"] if "cells" in x]
    summary = {}
    for label in labels:
        mine = [x["cells"] for x in ok if x["label"] == label]
        if not mine:
            continue
        summary[label] = {shape: {} for shape in mine[0]}
        for shape in mine[0]:
            for fn in ("attention_triton", "wmtp.attention"):
                for m in ("per_call_us", "host_us", "plain_us"):
                    summary[label][shape][f"{fn} {m}"] = round(statistics.median(c[shape][fn][m] for c in mine), 2)
            summary[label][shape]["graph_us"] = round(statistics.median(c[shape]["graph_us"] for c in mine), 2)
    res["medians_over_rounds"] = summary
    outs = {label: torch.load(f"/tmp/exp15-{label}.pt") for label in labels if os.path.exists(f"/tmp/exp15-{label}.pt")}
    if len(outs) == 2:
        a, b = outs.values()
        res["outputs_equal"] = {str(D): bool(torch.equal(a[D], b[D])) for D in a}
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(summary, indent=1), res.get("outputs_equal"))


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1], sys.argv[2:])
