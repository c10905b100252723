"""Compile the Triton kernel's default H200 launches for sm_90 on any machine, no GPU needed.

Each cell of ``wmtp bench attention`` (arXiv 2607.21535, Sec. 3: the draft over sink + window, the
verify over every key; bf16, batch 1, S = 1M) is planned by ``plan_call`` on ``meta`` tensors with an
H200's limits, so the arguments and constexprs are the ones ``_launch`` passes on the GPU. Then
``triton.compile`` builds PTX and a cubin for sm_90 without a driver, and ``ptxas -v`` (shipped with
Triton) reports registers and spills. With ``--sass DIR`` the PTX and the SASS (``nvdisasm``) of
every cell are written there: where the loads are issued, how many barriers, what waits for what.
The installed Triton compiles (3.7.1 here; the H200 runs 3.6.0): the launch plan is the same, the
generated code may differ in detail.

    python scripts/kernel_sm90.py                 # a table
    python scripts/kernel_sm90.py --json          # one JSON object (tests/test_kernel_sm90.py)
    python scripts/kernel_sm90.py --sass out/     # also out/<cell>.ptx and out/<cell>.sass
    python scripts/kernel_sm90.py --jobs 1        # one process (default: one a CPU core)

Run it without ``TRITON_INTERPRET=1``: the interpreter's kernels cannot be compiled.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from wmtp.attention import triton_attention as ta  # (wmtp.attention is also a function name)

H200 = (132, 232448, True)  # SMs, opt-in shared memory per block (bytes), programmatic dependent launch
S = 1 << 20  # the benchmark's largest context
CELLS = {  # (Hq, Hkv, D, Lq, window, paged[, dtype, q_sink]): the benchmark's draft and verify cells (bf16), and
    # re-indexed drafts (a second query tile for the sinks: NOTE [Re-indexed sinks]) in bf16 and in fp32, the
    # largest tile of the ieee path (64 rows of 256 dims, whose shared memory an H200 run found over the limit)
    "draft-D256": (16, 2, 256, 1, 4096, False), "draft-D128": (32, 8, 128, 1, 4096, False),
    "draft-D256-Lq8": (16, 2, 256, 8, 4096, False), "draft-D128-Lq8-paged": (32, 8, 128, 8, 4096, True),
    "verify-D256": (16, 2, 256, 1, None, False), "verify-D256-Lq8": (16, 2, 256, 8, None, False),
    "verify-D128-Lq8": (32, 8, 128, 8, None, False), "verify-D256-Lq8-paged": (16, 2, 256, 8, None, True),
    "reindexed-D256-Lq8": (16, 2, 256, 8, 4096, False, torch.bfloat16, True),
    "reindexed-D256-Lq8-fp32": (16, 2, 256, 8, 4096, False, torch.float32, True),
    # the small preset's fp32 calls, whose dots are tf32x3 (NOTE [tf32x3] in attention/triton_plan.py)
    "small-verify-D64-Lq8-fp32": (4, 4, 64, 8, None, False, torch.float32),
    "small-draft-D64-fp32": (4, 4, 64, 1, 64, False, torch.float32),
    # prefills (NOTE [Chunks]): 4096 queries in chunks of one tile, one launch; the small preset's in fp32 (tf32x3)
    "prefill-D256-Lq4096": (16, 2, 256, 4096, None, False),
    "small-prefill-D64-Lq16384-fp32": (4, 4, 64, 16384, None, False, torch.float32),
}
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
         torch.int32: "i32", torch.int64: "i64"}
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def plan(Hq: int, Hkv: int, D: int, Lq: int, window: int | None, paged: bool, dtype: torch.dtype = torch.bfloat16,
         q_sink: bool = False) -> ta.KernelCall:
    """The H200 launch of one cell: batch 1, queries at the end of S keys, 64 sinks, pages of 16."""
    meta = dict(device="meta", dtype=dtype)
    q = torch.empty(1, Hq, Lq, D, **meta)  # (B, Hq, Lq, D)
    q_pos = torch.empty(Lq, device="meta", dtype=torch.int64)
    if paged:  # (num_pages, page_size, Hkv, D) and a (B, max_pages) block table
        k = torch.empty(S // 16, 16, Hkv, D, **meta)
        bt, page = torch.empty(1, S // 16, device="meta", dtype=torch.int32), 16
    else:  # (B, Hkv, S, D)
        k = torch.empty(1, Hkv, S, D, **meta)
        bt, page = None, 1
    return ta.plan_call(q, k, k, bt, page, q_pos, 64, window, (None,) * 5, H200, q if q_sink else None)


def compile_sm90(call: ta.KernelCall):
    """``_attention_kernel`` compiled for sm_90 with the call's arguments, specialised as Triton's
    launcher does (ints equal to 1 folded, multiples of 16 marked divisible, pointers 16-aligned)."""
    kw = dict(call.kwargs)
    options = {"num_warps": kw.pop("num_warps"), "num_stages": kw.pop("num_stages")}
    sig, consts, attrs = {}, dict(kw), {}
    for i, (name, value) in enumerate(zip(ta._attention_kernel.arg_names, call.args)):
        if isinstance(value, torch.Tensor):
            sig[name], attrs[(i,)] = "*" + TYPES[value.dtype], [["tt.divisibility", 16]]
        elif value == 1:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            attrs.update({(i,): [["tt.divisibility", 16]]} if value % 16 == 0 else {})
    sig.update({name: "constexpr" for name in kw})
    return triton.compile(ASTSource(ta._attention_kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def resources(compiled) -> dict:
    """Shared memory (Triton's metadata), registers and spill bytes (``ptxas -v``) of a compiled kernel."""
    report = subprocess.run([os.path.join(BIN, "ptxas"), "-v", "-arch=sm_90a", "-", "-o", os.devnull],
                            input=compiled.asm["ptx"], capture_output=True, text=True, check=True).stderr
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
    return {"shared": compiled.metadata.shared, "registers": int(re.search(r"Used (\d+) registers", report)[1]),
            "spill_bytes": sum(spills)}


def cell(name: str, sass: str | None = None) -> dict:
    """Plan and compile one cell; its launch, precision and resources (and, with ``sass``, its files)."""
    call = plan(*CELLS[name])
    compiled = compile_sm90(call)
    if sass:
        os.makedirs(sass, exist_ok=True)
        stem = os.path.join(sass, name)
        with open(stem + ".ptx", "w") as f:
            f.write(compiled.asm["ptx"])
        with open(stem + ".cubin", "wb") as f:
            f.write(compiled.asm["cubin"])
        with open(stem + ".sass", "w") as f:
            subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", stem + ".cubin"], stdout=f, check=True)
    return {"grid": list(call.grid), "block_n": call.kwargs["BLOCK_N"], "num_warps": call.kwargs["num_warps"],
            "num_stages": call.kwargs["num_stages"], "precision": call.kwargs["PRECISION"], **resources(compiled)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--sass", metavar="DIR", help="also write each cell's PTX and SASS into DIR")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                    help="compile in N processes (default: one a CPU core)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("kernel_sm90.py: error: unset TRITON_INTERPRET: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"kernel_sm90.py: error: --jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    jobs = min(args.jobs, len(CELLS))
    if jobs == 1:
        cells = [cell(name, args.sass) for name in CELLS]
    else:  # spawned, not forked: the parent has imported torch (and its thread pools)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            cells = list(pool.map(cell, CELLS, [args.sass] * len(CELLS)))
    result = {"triton": triton.__version__, "limits": {"sms": H200[0], "shared_bytes": H200[1]},
              "cells": dict(zip(CELLS, cells))}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"triton {result['triton']}, sm_90, H200 limits: {H200[0]} SMs, {H200[1]} B shared memory a block")
    heads = ("grid", "block_n", "warps", "stages", "shared B", "regs", "spill B")
    print(f"{'cell':24}", *(f"{h:>9}" for h in heads))
    for name, r in result["cells"].items():
        grid = "x".join(map(str, r["grid"]))
        print(f"{name:24}", *(f"{x:>9}" for x in (grid, r["block_n"], r["num_warps"], r["num_stages"], r["shared"],
                                                  r["registers"], r["spill_bytes"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
