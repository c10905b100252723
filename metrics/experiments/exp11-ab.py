"""Experiment 11 (prepared in session 6, not yet run): K and V loads in the other order.

Compiled offline for sm_90 (triton 3.7.1, scripts/kernel_sm90.py --sass), the default D128 draft
issues K's global loads, then stores K to shared memory, waiting for K's data, and only then
issues V's loads: two memory round trips one after the other in every block (the D256 draft does
so only in its masked blocks). With V's load written first (``V_FIRST``, exp11-v-first.patch)
both loads are issued before any store, but the D128 draft then takes 150 registers instead of
128 (three programs a multiprocessor instead of four: its 528 programs no longer fit one wave);
``maxnreg=128`` keeps four, and the compiled code then issues 15 of V's and K's 16 loads before
the first store. This script times the variants side by side on an H200 (run from a tree with
the patch applied):

    git apply metrics/experiments/exp11-v-first.patch
    PYTHONPATH=$PWD python3 metrics/experiments/exp11-ab.py $OUT/exp11.json

Cells: the drafts (q_len 1 and 8, contiguous; q_len 1 paged) and verifies (q_len 1 and 8) at
S = 1M, bf16, both bench shapes. Timings: ``graph_ms`` (do_bench of one graph replay, the bar's)
and ``step_ms`` (wmtp/bench_timing.py), the verifies as plain-call medians too; three
interleaved rounds, medians; every output compared with the default variant's by torch.equal.
"""

import json
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from wmtp.attention import triton_attention as ta
from wmtp.attention.paged import paginate
from wmtp.bench_timing import capture_graph, l2_flush, step_ms
from wmtp.metrics import environment

S, N_SINK, WINDOW, ROUNDS = 1 << 20, 64, 4096, 3
OUT = sys.argv[1]
VARIANTS = {"default": {"v_first": False, "maxnreg": None}, "v_first": {"v_first": True, "maxnreg": None},
            "v_first_maxnreg128": {"v_first": True, "maxnreg": 128}, "maxnreg128": {"v_first": False, "maxnreg": 128}}
t0 = time.perf_counter()
dev = torch.device("cuda")
flush = l2_flush(dev)
res = {"command": "PYTHONPATH=$PWD python3 metrics/experiments/exp11-ab.py $OUT/exp11.json (with exp11-v-first.patch)",
       "environment": environment(dev), "doc": __doc__, "unit": "us", "rows": []}


def us(x):
    return x * 1e3 if isinstance(x, float) else x


def graph_us(fn):
    return float(do_bench(capture_graph(fn).replay, warmup=25, rep=100, return_mode="median")) * 1e3


gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_pages, v_pages, table = paginate(k, v, 16, gen)
    cells = {}
    for q_len in (1, 8):
        q = torch.randn(1, Hq, q_len, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, Lq, D)
        pos = torch.arange(S - q_len, S, device="cuda")
        cells[f"draft q{q_len}"] = lambda q=q, pos=pos: ta.attention_triton(q, k, v, pos, N_SINK, WINDOW)
        cells[f"verify q{q_len}"] = lambda q=q, pos=pos: ta.attention_triton(q, k, v, pos)
        if q_len == 1:
            cells["draft q1 paged"] = lambda q=q, pos=pos: ta.paged_attention_triton(q, k_pages, v_pages, table, pos,
                                                                                      N_SINK, WINDOW)
    names = [n for n in VARIANTS if D == 128 or "maxnreg" not in n]
    refs, runs = {}, {(c, n): [] for c in cells for n in names}
    for r in range(ROUNDS):
        for c, fn in cells.items():
            for n in names:  # interleaved: drift hits every variant alike
                ta.EXP11.update(VARIANTS[n])
                row = runs[(c, n)]
                try:
                    out = fn()
                    refs.setdefault(c, out.clone())
                    t = {"graph": graph_us(fn), "step": us(step_ms(fn, flush)),
                         "equal": bool(torch.equal(out, refs[c]))}
                    if c.startswith("verify"):
                        t["plain"] = float(do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3
                    row.append(t)
                except Exception as e:  # noqa: BLE001
                    row.append({"error": f"{type(e).__name__}: {e}"[:300]})
    ta.EXP11.update(VARIANTS["default"])
    for (c, n), rs in runs.items():
        row = {"shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", "cell": c, "variant": n}
        if any("error" in x for x in rs):
            row["error"] = next(x["error"] for x in rs if "error" in x)
        else:
            row.update({m: round(statistics.median(x[m] for x in rs), 2) for m in rs[0] if m != "equal"})
            row["equal_to_default"] = all(x["equal"] for x in rs)
        res["rows"].append(row)
        print(row, flush=True)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1)
    k = v = k_pages = v_pages = None
    torch.cuda.empty_cache()
