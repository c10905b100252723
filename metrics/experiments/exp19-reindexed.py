"""Experiment 19 (session 13): what re-indexed sinks cost the Triton draft (NOTE [Re-indexed sinks]).

With ``q_sink`` the kernel loads a second query tile and scores its sink range with it
(``QSINK``); the launch counts that tile's shared memory (``launch_config(q_tiles=2)``). This times
the draft with and without ``q_sink`` on the bench's S = 1M draft cells (bf16, both shapes, 64
sinks + 4096 window, ``q_len`` 1 and 8, contiguous and paged with pages of 16): ``graph_ms``
(do_bench of one CUDA-graph replay, cold L2, median), three interleaved rounds, medians. It also
checks the re-indexed launch with ``q_sink = q`` against the absolute one (max |difference|: the
same queries score every key, so it must be 0 or rounding).

    PYTHONPATH=$PWD python3 metrics/experiments/exp19-reindexed.py $OUT/exp19.json
"""

import json
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.attention.paged import paginate
from wmtp.bench_timing import capture_graph
from wmtp.metrics import environment

S, N_SINK, WINDOW, ROUNDS = 1 << 20, 64, 4096, 3


def main(path: str) -> None:
    t0 = time.perf_counter()
    dev = torch.device("cuda")
    res = {"command": "PYTHONPATH=$PWD python3 metrics/experiments/exp19-reindexed.py $OUT/exp19.json",
           "environment": environment(dev), "doc": __doc__, "unit": "us (graph_ms)", "rows": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
        k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
        v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k_pages, v_pages, table = paginate(k, v, 16, gen)
        cells, same = {}, {}
        for q_len in (1, 8):
            q = torch.randn(1, Hq, q_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, Lq, D)
            q_sink = torch.randn(1, Hq, q_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)
            pos = torch.arange(S - q_len, S, device="cuda")
            for paged in (False, True):
                name = f"draft q{q_len}" + (" paged" if paged else "")

                def call(qs, q=q, pos=pos, paged=paged):
                    if paged:
                        return ta.paged_attention_triton(q, k_pages, v_pages, table, pos, N_SINK, WINDOW, q_sink=qs)
                    return ta.attention_triton(q, k, v, pos, N_SINK, WINDOW, q_sink=qs)

                cells[name] = {"absolute": lambda call=call: call(None),
                               "reindexed": lambda call=call, qs=q_sink: call(qs)}
                same[name] = (call(None) - call(q)).abs().max().item()
        runs = {(c, a): [] for c in cells for a in ("absolute", "reindexed")}
        for _ in range(ROUNDS):
            for c, arms in cells.items():
                for a, fn in arms.items():  # interleaved: drift hits both alike
                    runs[(c, a)].append(float(do_bench(capture_graph(fn).replay, warmup=25, rep=100,
                                                       return_mode="median")) * 1e3)
        for c in cells:
            row = {"shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", "cell": c,
                   **{a: round(statistics.median(runs[(c, a)]), 2) for a in ("absolute", "reindexed")},
                   "rounds": {a: [round(t, 2) for t in runs[(c, a)]] for a in ("absolute", "reindexed")},
                   "max_abs_diff_q_sink_equal_q": same[c]}
            row["reindexed_slowdown"] = round(row["reindexed"] / row["absolute"] - 1, 4)  # new/old - 1
            res["rows"].append(row)
            print(row, flush=True)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        k = v = k_pages = v_pages = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
