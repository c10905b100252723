"""Experiment 63's compiled code (session 48): the old and the new paged key loop, compiled for sm_90.

No GPU needed (scripts/kernel_sm90.py's offline compile, the installed Triton: 3.7.1 on the CPU
machine). Plans the paged D128 draft of the batch-4 sweep at 1M keys (Hq32/Hkv8, bf16, 16-row pages,
sink 64 + window 4096; its pool of 2^32 elements plans 64-bit pages) with one and with eight queries,
compiles it with ``OFF`` as planned (int64) and forced to int32, in this library's kernel (``new``)
and in the kernel with the old loop put back (``old``, as exp63-page-offsets.py swaps it in), and
prints registers, spill bytes and SASS lines (``nvdisasm``'s instructions, NOPs included).

Usage: python3 metrics/experiments/exp63-compiled.py   (without TRITON_INTERPRET=1)
"""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import kernel_sm90 as K  # noqa: E402

from wmtp.attention import triton_attention as new  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def load_old():
    """The kernel module with exp63-page-offsets.py's OLD loop in place of its NEW one."""
    script = open(os.path.join(HERE, "exp63-page-offsets.py")).read()
    old, cur = (re.search(name + r' = """(.*?)"""', script, re.S)[1] for name in ("OLD", "NEW"))
    src = open(new.__file__).read()
    if cur not in src:
        raise SystemExit("exp63-compiled: the kernel's key loop is not exp63's NEW")
    path = os.path.join(tempfile.mkdtemp(), "triton_attention_exp63_old.py")
    with open(path, "w") as f:
        f.write(src.replace(cur, old))
    spec = importlib.util.spec_from_file_location("wmtp.attention.triton_attention_exp63_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plan(Lq: int, B: int = 4, S: int = 1 << 20):
    meta = dict(device="meta", dtype=torch.bfloat16)
    q = torch.empty(B, 32, Lq, 128, **meta)  # (B, Hq, Lq, D)
    q_pos = torch.empty(Lq, device="meta", dtype=torch.int64)
    pages = torch.empty(B * S // 16, 16, 8, 128, **meta)  # (num_pages, page_size, Hkv, D)
    table = torch.empty(B, S // 16, device="meta", dtype=torch.int32)
    return new.plan_call(q, pages, pages, table, 16, q_pos, 64, 4096, (None,) * 5, K.H200, None)


def sass_lines(compiled) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([os.path.join(K.BIN, "nvdisasm"), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout
    return sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]+\*/\s+[A-Z@]", line))


modules = {"old": load_old(), "new": new}
print(f"{'kernel':6} {'q_len':>5} {'pages':>6} {'regs':>5} {'spill B':>8} {'SASS':>6}")
for Lq in (1, 8):
    call = plan(Lq)
    for name, module in modules.items():
        for off in (tl.int32, tl.int64):
            K.ta = module  # compile_sm90 compiles ``ta._attention_kernel``
            compiled = K.compile_sm90(call._replace(kwargs={**call.kwargs, "OFF": off}))
            r = K.resources(compiled)
            print(f"{name:6} {Lq:>5} {str(off):>6} {r['registers']:>5} {r['spill_bytes']:>8} {sass_lines(compiled):>6}")
