"""Experiment 32: decoding in the CUDA-graph loop with the small preset's float32 attention dots as
tf32x3 (NOTE [tf32x3] in wmtp/attention/triton_plan.py) against IEEE FMA loops, side by side in one
run on the H200: experiment 31 timed single calls, and a launch is judged in the loop (experiment 30).

Variants: ``ieee`` (``triton_plan.precision`` patched to give float32 ``"ieee"``, the code before)
and ``tf32x3`` (as committed); the plan and launch caches are cleared at each switch, since
neither keys the precision. The loop, the models and the figures are
metrics/experiments/side_by_side.py's; every run is asserted token-equal to its variant's dense
tokens (the variants' dense tokens may differ in a near-tie: the JSON says whether they did).

Usage: python3 metrics/experiments/exp32-tf32x3-loop.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

import torch
from side_by_side import run

from wmtp.attention import triton_attention, triton_merge, triton_plan

committed = triton_plan.precision


def _use(precision) -> None:
    triton_plan.precision = precision
    triton_plan._static_plan.cache_clear()
    triton_attention._ATTENTION.kernels.clear()
    triton_merge._MERGE.kernels.clear()


def ieee() -> None:
    _use(lambda dtype, device_type, block_m, D: "ieee" if dtype in (torch.float32, torch.float64) else "tf32")


def tf32x3() -> None:
    _use(committed)


run(32, {"ieee": ieee, "tf32x3": tf32x3}, sys.argv)
