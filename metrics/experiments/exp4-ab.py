"""A/B on one H200: the kernel at c622c37 (triton_attention_old) against the working tree, in the
bench's method (do_bench of a CUDA-graph replay, cold dirty L2, median), rounds interleaved.
Also the bench-method floors: graphs of 1 and 2 empty kernels, read-only kernels, torch.sum."""

import json
import statistics
import sys
import time

import torch
from triton.testing import do_bench

sys.path.insert(0, "scripts")
from draft_floor import _read  # noqa: E402

from wmtp.attention import triton_attention as new  # noqa: E402
from wmtp.attention import triton_attention_old as old  # noqa: E402
from wmtp.bench_timing import capture_graph  # noqa: E402
from wmtp.metrics import environment  # noqa: E402

S, N_SINK, WINDOW, PAGE = 1 << 20, 64, 4096, 16
OUT = sys.argv[1]
ROUNDS = 3
t0 = time.perf_counter()
res = {"environment": environment(torch.device("cuda")), "S": S, "rows": []}


def bench_us(fn):
    g = capture_graph(fn)
    return float(do_bench(g.replay, warmup=25, rep=100, return_mode="median")) * 1e3


def save():
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1)


def timed(name, fns, **meta):
    """fns: {variant: fn}; ROUNDS interleaved rounds; median over rounds per variant."""
    ts = {v: [] for v in fns}
    err = {}
    for _ in range(ROUNDS):
        for v, fn in fns.items():
            try:
                ts[v].append(bench_us(fn))
            except Exception as e:  # noqa: BLE001
                err[v] = f"{type(e).__name__}: {e}"[:200]
    row = {"name": name, **meta, **{v: round(statistics.median(t), 2) for v, t in ts.items() if t},
           "rounds": {v: [round(x, 2) for x in t] for v, t in ts.items()}, "errors": err}
    res["rows"].append(row)
    print({k: v for k, v in row.items() if k != "rounds"}, flush=True)
    save()


x = torch.zeros(1, device="cuda")
timed("floor", {"one": lambda: x.add_(1), "two": lambda: x.add_(1).add_(1)})
gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    shape = f"Hq{Hq}/Hkv{Hkv}/D{D}"
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    kp = k.transpose(1, 2).reshape(S // PAGE, PAGE, Hkv, D)  # (pages, PAGE, Hkv, D), pages in order
    vp = v.transpose(1, 2).reshape(S // PAGE, PAGE, Hkv, D)
    bt = torch.randperm(S // PAGE, device="cuda", generator=gen).to(torch.int32)[None]  # scattered pages
    kp, vp = kp.contiguous(), vp.contiguous()
    pos1 = torch.tensor([S - 1], device="cuda")
    # read floors (bench method): window K and V only, and torch.sum of the same bytes contiguous
    fl = {}
    for bn, w in ((64, 4), (32, 8), (16, 4), (16, 8)):
        red = torch.empty(Hkv * WINDOW // bn, device="cuda")
        fl[f"read bn{bn} w{w}"] = (lambda bn=bn, w=w, red=red: _read[(Hkv, WINDOW // bn)](
            k, v, pos1, red, k.stride(1), k.stride(2), WINDOW, BLOCK_N=bn, D=D, num_warps=w))
    buf = torch.randn(2 * Hkv * (WINDOW + N_SINK) * D, device="cuda", dtype=torch.bfloat16, generator=gen)
    fl["torch.sum"] = lambda: buf.sum(dtype=torch.float32)
    timed("read floor", fl, shape=shape)
    for kind, Lq, window in (("draft", 1, WINDOW), ("draft", 8, WINDOW), ("verify", 1, None), ("verify", 8, None)):
        for off in ((0, 37) if kind == "draft" else (0,)):
            q = torch.randn(1, Hq, Lq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
            qp = torch.arange(S - Lq - off, S - off, device="cuda")
            for layout in ("contiguous", "paged16"):
                def mk(mod, **kw):
                    if layout == "contiguous":
                        return lambda: mod.attention_triton(q, k, v, qp, N_SINK, window, **kw)
                    return lambda: mod.paged_attention_triton(q, kp, vp, bt, qp, N_SINK, window, **kw)
                fns = {"old": mk(old), "new": mk(new)}
                if D == 256 and Lq == 8:
                    fns["new_w8"] = mk(new, num_warps=8)
                    fns["old_w8"] = mk(old, num_warps=8)
                ref = fns["old"]()
                diffs = {vv: float((f().float() - ref.float()).abs().max()) for vv, f in fns.items()}
                timed(kind, fns, shape=shape, Lq=Lq, offset=off, layout=layout, max_abs_diff_vs_old=diffs)
print("done", round(time.perf_counter() - t0, 1), "s")
