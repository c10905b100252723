"""Experiment 41: the attention kernels' output stored with a query's heads side by side (NOTE
[Output layout] in wmtp/attention/triton_plan.py), so the model's ``y.transpose(1, 2).reshape(...)``
before its output projection is a view, against the head-major output of the code before, where it
was a copy kernel a layer whenever a call has two or more queries (a verify pass, the draft's
extend), side by side in the CUDA-graph loop on the H200.

Variants: ``head_major`` (``triton_plan.TOKEN_MAJOR = False``) and ``token_major`` (as committed).
The flag is in the plan's static key, so neither variant reuses the other's plans or compiled
launches. The values are the same bits either way (tests/test_triton_attention.py). The loop, the
models and the figures are metrics/experiments/side_by_side.py's.

Usage: python3 metrics/experiments/exp41-output-layout.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

from side_by_side import run

from wmtp.attention import triton_plan


def head_major() -> None:
    triton_plan.TOKEN_MAJOR = False


def token_major() -> None:
    triton_plan.TOKEN_MAJOR = True


run(41, {"head_major": head_major, "token_major": token_major}, sys.argv)
