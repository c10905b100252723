"""Experiment 16 (session 8): the key loop's row offsets in int32 or int64 (NOTE [Offsets]).

09749e2 formed every offset that multiplies a stride in int64, the per-key row offsets of the key
loop (``krow``) included, so that tensors past 2^31 elements are read correctly. The sweep at
659c31d, the first after it, read the paged ``q_len``-8 cells slower than the sweep at 92930ff
(before it): the D256 verify 710 -> 757 us at 1M keys, both ``q_len``-8 paged drafts about 2 us,
while the contiguous cells did not move. Compiled offline for sm_90 (triton 3.7.1), int32 row
offsets take the paged D128 ``q_len``-8 draft from 252 to 213 registers and the paged D256
``q_len``-8 verify's spills from 968 to 816 B, but raise the contiguous D256 ``q_len``-8 cells'
spills (draft 172 -> 308 B, verify 192 -> 352 B). The plan's ``OFF`` constexpr picks the width;
this script times both widths on every S = 1M cell of the bench (bf16, both shapes; drafts with 64
sinks + 4096 window, ``q_len`` 1 and 8, contiguous and paged with pages of 16), ``graph_ms`` (do_bench
of one graph replay), three interleaved rounds, medians, and checks that the two widths' outputs
are ``torch.equal``. The launch cache is off (its key does not hold ``OFF``, which the plan derives
from shapes; here it is forced), so Triton's own launch path picks the kernel:

    PYTHONPATH=$PWD python3 metrics/experiments/exp16-offsets.py $OUT/exp16.json
"""

import json
import statistics
import sys
import time
from types import MappingProxyType

import torch
import triton.language as tl
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.attention import triton_plan as tp
from wmtp.attention.paged import paginate
from wmtp.bench_timing import capture_graph
from wmtp.metrics import environment

S, N_SINK, WINDOW, ROUNDS = 1 << 20, 64, 4096, 3
WIDTHS = {"int64": tl.int64, "int32": tl.int32}
real_plan_call = tp.plan_call
width = {"off": None}


def plan_call(*args, **kwargs):
    call = real_plan_call(*args, **kwargs)
    if width["off"] is None:
        return call
    return call._replace(kwargs=MappingProxyType(dict(call.kwargs, OFF=width["off"])))


def main(path: str) -> None:
    t0 = time.perf_counter()
    ta.plan_call = plan_call
    ta.fast_launches = lambda device: False  # Triton's own launch path: it keys on OFF
    dev = torch.device("cuda")
    res = {"command": "PYTHONPATH=$PWD python3 metrics/experiments/exp16-offsets.py $OUT/exp16.json",
           "environment": environment(dev), "doc": __doc__, "unit": "us (graph_ms)", "rows": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
        k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
        v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        k_pages, v_pages, table = paginate(k, v, 16, gen)
        cells = {}
        for q_len in (1, 8):
            q = torch.randn(1, Hq, q_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, Lq, D)
            pos = torch.arange(S - q_len, S, device="cuda")
            for window, kind in ((WINDOW, "draft"), (None, "verify")):
                n_sink = N_SINK if window else None
                cells[f"{kind} q{q_len}"] = lambda q=q, pos=pos, s=n_sink, w=window: ta.attention_triton(
                    q, k, v, pos, s, w)
                cells[f"{kind} q{q_len} paged"] = lambda q=q, pos=pos, s=n_sink, w=window: ta.paged_attention_triton(
                    q, k_pages, v_pages, table, pos, s, w)
        runs = {(c, w): [] for c in cells for w in WIDTHS}
        outs = {}
        for _ in range(ROUNDS):
            for c, fn in cells.items():
                for w, off in WIDTHS.items():  # interleaved: drift hits both widths alike
                    width["off"] = off
                    try:
                        outs.setdefault((c, w), fn())
                        runs[(c, w)].append(float(do_bench(capture_graph(fn).replay, warmup=25, rep=100,
                                                           return_mode="median")) * 1e3)
                    except Exception as e:  # noqa: BLE001
                        runs[(c, w)].append(f"{type(e).__name__}: {e}"[:300])
        width["off"] = None
        for c in cells:
            row = {"shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", "cell": c}
            for w in WIDTHS:
                ts = runs[(c, w)]
                row[w] = round(statistics.median(ts), 2) if all(isinstance(t, float) for t in ts) else ts[-1]
            if all(isinstance(row[w], float) for w in WIDTHS):
                row["int32_speedup"] = round(row["int64"] / row["int32"] - 1, 4)  # old/new - 1
            row["equal"] = bool(torch.equal(outs[(c, "int64")], outs[(c, "int32")])) if all(
                (c, w) in outs for w in WIDTHS) else None
            res["rows"].append(row)
            print(row, flush=True)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        k = v = k_pages = v_pages = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
