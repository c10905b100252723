"""The Triton kernel's default H200 launches, compiled offline for sm_90 on the CPU (no GPU needed).

scripts/kernel_sm90.py plans every cell of the attention benchmark with ``plan_call`` on ``meta``
tensors and an H200's limits (the arguments ``_launch`` passes on the GPU), compiles it for sm_90 and
reads registers and spills from ``ptxas -v``. It runs in a subprocess without ``TRITON_INTERPRET``,
which conftest.py sets for this CPU-only session and under which kernels cannot be compiled.
Checked: every launch fits the H200's shared memory (an earlier GPU run found 3-stage D256 launches
that did not), and the one-query draft launches, which are latency-bound, never spill. The installed
Triton compiles (CI pins 3.7.1; the H200 runs 3.6.0): this guards the launch plan, not the GPU's code.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wmtp.attention import triton_attention as ta

ROOT = Path(__file__).resolve().parents[1]
H200 = (132, 232448, True)  # SMs, opt-in shared memory per block (bytes), programmatic dependent launch


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_sm90.py"), "--json"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


def test_plan_call_on_meta_tensors_is_the_h200_launch():
    q = torch.empty(1, 16, 1, 256, device="meta", dtype=torch.bfloat16)  # (B, Hq, Lq, D)
    k = torch.empty(1, 2, 1 << 20, 256, device="meta", dtype=torch.bfloat16)  # (B, Hkv, S, D)
    call = ta.plan_call(q, k, k, None, 1, torch.empty(1, device="meta", dtype=torch.int64), 64, 4096,
                        (None,) * 5, H200)
    # launch_config's literal draft launch at D256 (tests/test_triton_attention.py): 66 splits of 64 keys
    assert call.grid == (2, 66) and call.kwargs["BLOCK_N"] == 64 and call.kwargs["num_stages"] == 1
    assert call.kwargs["PDL"] and call.merge is not None and call.out.device.type == "meta"
    assert ta.plan_call(q, k, k, None, 1, torch.empty(1, device="meta", dtype=torch.int64), 64, 4096,
                        (None,) * 5, None).grid == (2, 1)  # the CPU interpreter's plan: one split


def test_every_benchmark_launch_fits_the_h200(compiled):
    assert set(compiled["cells"]) == {"draft-D256", "draft-D128", "draft-D256-Lq8", "draft-D128-Lq8-paged",
                                      "verify-D256", "verify-D256-Lq8", "verify-D128-Lq8", "verify-D256-Lq8-paged",
                                      "reindexed-D256-Lq8", "reindexed-D256-Lq8-fp32", "small-verify-D64-Lq8-fp32",
                                      "small-draft-D64-fp32", "prefill-D256-Lq4096", "small-prefill-D64-Lq16384-fp32"}
    for name, cell in compiled["cells"].items():
        assert 0 < cell["shared"] <= H200[1], (name, cell)


def test_the_small_presets_float32_launches_compile_tf32x3_without_spills(compiled):
    """NOTE [tf32x3]: the tiles that take it fit in shared memory (a D256 one of 64 rows did not); the
    decode tiles spill nothing, the prefill's 64-row tile 200 B (5.8 KB with IEEE dots)."""
    for name in ("small-verify-D64-Lq8-fp32", "small-draft-D64-fp32"):
        cell = compiled["cells"][name]
        assert cell["precision"] == "tf32x3" and cell["spill_bytes"] == 0, (name, cell)
    cell = compiled["cells"]["small-prefill-D64-Lq16384-fp32"]
    assert cell["precision"] == "tf32x3" and cell["spill_bytes"] <= 1024, cell
    assert compiled["cells"]["reindexed-D256-Lq8-fp32"]["precision"] == "ieee"


def test_prefills_are_one_launch_of_every_chunk(compiled):
    """NOTE [Chunks]: grid axis 0 runs over (chunk, batch, kv head); so many programs need no split."""
    assert compiled["cells"]["prefill-D256-Lq4096"]["grid"] == [4096 // 8 * 2, 1]  # 64 rows of D256: 8 queries
    assert compiled["cells"]["small-prefill-D64-Lq16384-fp32"]["grid"] == [16384 // 64 * 4, 1]  # 64 fp32 rows


def test_one_query_draft_launches_never_spill(compiled):
    for name in ("draft-D256", "draft-D128"):  # one block a program: a spill is a memory trip on the critical path
        cell = compiled["cells"][name]
        assert cell["spill_bytes"] == 0 and cell["num_stages"] == 1, (name, cell)


PAGE_PRODUCTS = """
import json, re, sys
import torch, triton.language as tl
sys.path.insert(0, "scripts")
import kernel_sm90 as K
from wmtp.attention import triton_attention as ta
meta = dict(device="meta", dtype=torch.bfloat16)
q = torch.empty(4, 32, 1, 128, **meta)  # (B, Hq, Lq, D)
pages = torch.empty(4 * 2**16, 16, 8, 128, **meta)  # (num_pages, page_size, Hkv, D): 2^32 elements
table = torch.empty(4, 2**16, device="meta", dtype=torch.int32)  # (B, pages a row): 1M keys
call = ta.plan_call(q, pages, pages, table, 16, torch.empty(1, device="meta", dtype=torch.int64), 64, 4096,
                    (None,) * 5, K.H200, None)
out = {"PAGE_STRIDE": call.kwargs["PAGE_STRIDE"], "OFF": str(call.kwargs["OFF"])}
for name, kw in (("planned", {}), ("argument", {"PAGE_STRIDE": 0}), ("int32", {"PAGE_STRIDE": 0, "OFF": tl.int32})):
    out[name] = len(re.findall("mul.lo.s64", K.compile_sm90(call._replace(kwargs={**call.kwargs, **kw})).asm["ptx"]))
print(json.dumps(out))
"""


def test_pages_past_2_to_the_31_multiply_by_the_page_stride_as_a_literal():
    """NOTE [Offsets]: the paged D128 one-query draft at batch 4 over 1M keys (a pool of 2^32 elements:
    int64 pages) compiles its page products as int32 pages do, without a 64-bit multiply a key: its PTX
    has as many ``mul.lo.s64`` as the int32 launch's, and fewer than with the stride an argument."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", PAGE_PRODUCTS], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    counts = json.loads(run.stdout)
    assert (counts["PAGE_STRIDE"], counts["OFF"]) == (16 * 8 * 128, "int64")
    assert counts["planned"] == counts["int32"] < counts["argument"], counts
