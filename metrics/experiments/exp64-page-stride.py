"""Experiment 64 (session 49): a paged key loop's 64-bit page offsets with the page stride known at compile time.

Experiment 63 left 64-bit page offsets (``OFF`` int64, NOTE [Offsets] in attention/triton_attention.py:
any page pool past 2^31 elements) 7.7 % slower than 32-bit ones on the paged D128 batch-4 draft.
Compiled offline for sm_90 (triton 3.7.1), each key's ``page.to(OFF) * stride_outer`` was a full 64-bit
multiply (PTX ``mul.lo.s64``: three SASS instructions and a sign extension), because the stride's
sign extension is hoisted out of the loop, where the code generator no longer sees two 32-bit
operands. With the stride a literal, it is a 32-bit widening multiply(-add), as with int32 pages.
The plan now passes int64 pages' stride as the constexpr ``PAGE_STRIDE``; this times the kernel as
planned (``literal``) against the same kernel with ``PAGE_STRIDE`` forced to 0 (``argument``: the
stride read from the kernel's argument, the code before), with ``OFF`` as planned and forced to int64
(on pools below 2^31 elements, where both widths are correct). Cells: the bench's paged shapes, D128
(Hq32/Hkv8) and D256 (Hq16/Hkv2), bf16, 16-row pages permuted at random (``paginate``), sink 64 +
window 4096 for the draft, every key for the verify, queries at the end of the cache, at batches
whose pools sit at and past 2^31 elements. Timing:
``graph_ms`` (a CUDA graph's replay under ``do_bench``, cold L2), three rounds with the settings
interleaved, the median; outputs ``torch.equal`` across settings.

Usage: python3 metrics/experiments/exp64-page-stride.py OUT.json    (a GPU)
       python3 metrics/experiments/exp64-page-stride.py --compiled  (no GPU: registers, spills, SASS lines)
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from types import MappingProxyType

import torch

from wmtp.attention import triton_attention as ta
from wmtp.attention import triton_plan

N_SINK, WINDOW, PAGE, ROUNDS = 64, 4096, 16, 3
SHAPES = {128: (32, 8), 256: (16, 2)}  # D: (Hq, Hkv)
CELLS = [  # (D, B, S, q_len, windowed): pools of B * S * Hkv * D elements
    *[(128, 4, 1 << 19, q, True) for q in (1, 8)],  # 2^31: both widths correct
    *[(128, 4, 1 << 20, q, True) for q in (1, 8)],  # 2^32: 64-bit only
    (128, 4, 1 << 20, 8, False),
    *[(256, 4, 1 << 20, q, True) for q in (1, 8)],  # 2^31
    *[(256, 8, 1 << 20, q, True) for q in (1, 8)],  # 2^32
    (256, 8, 1 << 20, 8, False),
]
PLANNED_OFFSET, PLANNED_STATIC = triton_plan.max_offset, triton_plan._static_plan


def use(setting: str) -> None:
    """``<width>_<stride>``: pages' width (``OFF``) as planned or ``int64`` (forced), their stride as planned
    (``literal``: int64 pages' stride a constexpr) or read from the argument (``argument``); drops
    cached plans and compiled launches (the launch cache keys on the plan's key, not on these)."""
    width, stride = setting.split("_")
    triton_plan.max_offset = PLANNED_OFFSET if width == "planned" else (  # OFF forced; ROW (a page's 2 dims) not
        lambda shape, strides: 2**31 if len(shape) == 4 else PLANNED_OFFSET(shape, strides))
    PLANNED_STATIC.cache_clear()
    if stride == "literal":
        triton_plan._static_plan = PLANNED_STATIC
    else:
        def static(*key, **kw):
            plan = PLANNED_STATIC(*key, **kw)
            return plan._replace(kwargs=MappingProxyType({**plan.kwargs, "PAGE_STRIDE": 0}))
        triton_plan._static_plan = static
    ta._ATTENTION.kernels.clear()


def settings(pool: torch.Tensor) -> tuple[str, tuple[str, ...]]:
    """The pool's planned width and the settings to time: both strides of int64 pages, planned or forced."""
    planned = "int32" if PLANNED_OFFSET(tuple(pool.shape), pool.stride()) < 2**31 else "int64"
    if planned == "int64":
        return planned, ("planned_literal", "planned_argument")
    return planned, ("planned_literal", "int64_literal", "int64_argument")  # int32 pages take no literal


def compiled() -> None:
    """Registers, spill bytes and SASS lines of every setting, sm_90 offline."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
    import kernel_sm90 as K

    print(f"{'cell':24} {'setting':18} {'OFF':>6} {'stride':>6} {'regs':>5} {'spill B':>8} {'SASS':>6}")
    for D, B, S, Lq, windowed in CELLS:
        Hq, Hkv = SHAPES[D]
        meta = dict(device="meta", dtype=torch.bfloat16)
        q = torch.empty(B, Hq, Lq, D, **meta)  # (B, Hq, Lq, D)
        q_pos = torch.empty(Lq, device="meta", dtype=torch.int64)  # (Lq,)
        pages = torch.empty(B * S // PAGE, PAGE, Hkv, D, **meta)  # (num_pages, PAGE, Hkv, D)
        table = torch.empty(B, S // PAGE, device="meta", dtype=torch.int32)  # (B, pages a row)
        sink, window = (N_SINK, WINDOW) if windowed else (None, None)
        name = f"D{D} B{B} S{S >> 10}K q{Lq}{'' if windowed else ' full'}"
        for setting in settings(pages)[1]:
            use(setting)
            call = ta.plan_call(q, pages, pages, table, PAGE, q_pos, sink, window, (None,) * 5, K.H200, None)
            c = K.compile_sm90(call)
            r = K.resources(c)
            with tempfile.TemporaryDirectory() as tmp:
                with open(os.path.join(tmp, "k.cubin"), "wb") as f:
                    f.write(c.asm["cubin"])
                sass = subprocess.run([os.path.join(K.BIN, "nvdisasm"), "-c", os.path.join(tmp, "k.cubin")],
                                      capture_output=True, text=True, check=True).stdout
            n = sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]+\*/\s+[A-Z@]", line))
            print(f"{name:24} {setting:18} {str(call.kwargs['OFF']):>6} {call.kwargs['PAGE_STRIDE']:>6} "
                  f"{r['registers']:>5} {r['spill_bytes']:>8} {n:>6}", flush=True)
    use("planned_literal")


def timings(out: str) -> None:
    from triton.testing import do_bench

    from wmtp.attention.paged import paginate
    from wmtp.bench_timing import graph_replay_ms
    from wmtp.metrics import environment

    def write(res) -> None:
        with open(out + ".tmp", "w") as f:
            json.dump(res, f, indent=2)
        os.replace(out + ".tmp", out)

    t0 = time.perf_counter()
    res = {"command": f"python3 metrics/experiments/exp64-page-stride.py {out}",
           "environment": environment(torch.device("cuda")), "doc": __doc__, "n_sink": N_SINK, "window": WINDOW,
           "page_size": PAGE, "unit": "us: graph_ms, median of 3 rounds", "complete": False, "rows": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for D, B, S, Lq, windowed in CELLS:
        Hq, Hkv = SHAPES[D]
        sink, window = (N_SINK, WINDOW) if windowed else (None, None)
        k = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
        v = torch.randn(B, Hkv, S, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hkv, S, D)
        q = torch.randn(B, Hq, Lq, D, generator=gen, device="cuda", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
        q_pos = torch.arange(S - Lq, S, device="cuda")  # (Lq,)
        kp, vp, table = paginate(k, v, PAGE, gen)  # (pages, PAGE, Hkv, D) x2, (B, pages a row)
        k = v = None
        planned_off, names = settings(kp)
        fn = lambda: ta.paged_attention_triton(q, kp, vp, table, q_pos, sink, window)  # noqa: E731
        row = {"D": D, "Hq": Hq, "Hkv": Hkv, "B": B, "S": S, "q_len": Lq, "windowed": windowed,
               "page_stride": kp.stride(0), "planned_off": planned_off, "rounds_us": {n: [] for n in names},
               "us": {}, "equal": {}}
        try:
            ref = None
            for name in names:
                use(name)
                o = fn()
                ref = o if ref is None else ref
                row["equal"][name] = bool(torch.equal(o, ref))
            for _ in range(ROUNDS):
                for name in names:
                    use(name)
                    t = graph_replay_ms(fn, lambda f: float(do_bench(f, warmup=25, rep=30, return_mode="median")))
                    row["rounds_us"][name].append(t * 1e3 if isinstance(t, float) else t)
            for name, ts in row["rounds_us"].items():
                ok = [t for t in ts if isinstance(t, float)]
                row["us"][name] = statistics.median(ok) if ok else None
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        res["rows"].append(row)
        print(D, B, S, Lq, "window" if windowed else "full", planned_off,
              {n: round(t, 2) for n, t in row["us"].items() if t}, all(row["equal"].values()), row.get("error", ""),
              flush=True)
        res["wall_time_s"] = time.perf_counter() - t0  # written after every row: a run cut short keeps its rows
        write(res)
        q = kp = vp = table = ref = o = None  # free the cell's cache before the next one
        torch.cuda.empty_cache()
    use("planned_literal")
    res["complete"] = True
    write(res)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("Usage: ")[1])
    compiled() if sys.argv[1] == "--compiled" else timings(sys.argv[1])
