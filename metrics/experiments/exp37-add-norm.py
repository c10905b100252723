"""Experiment 37: decoding in the CUDA-graph loop with each residual addition made by the RMSNorm
kernel that reads its sum (``add_rms_norm`` in wmtp/rmsnorm.py, NOTE [Pending addition] in
wmtp/model.py then, wmtp/block.py since 91169fb) against an addition kernel and a norm kernel apart,
side by side in one run on the H200.

Variants: ``apart`` (``wmtp.model.add_rms_norm`` patched to torch's ``x + r`` then ``rms_norm``:
the kernels of the code before) and ``fused`` (as committed). Both give the same bits (the sums are
torch's; tests/test_rmsnorm.py). The loop, the models and the figures are
metrics/experiments/side_by_side.py's.

Usage: python3 metrics/experiments/exp37-add-norm.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

from side_by_side import run, stale_since

from wmtp import model as model_mod
from wmtp import rmsnorm


def _apart(x, r, w, eps, impl):
    s = x if r is None else x + r
    return s, rmsnorm.rms_norm(s, w, eps, impl)


def apart() -> None:
    model_mod.add_rms_norm = _apart


def fused() -> None:
    model_mod.add_rms_norm = rmsnorm.add_rms_norm


stale_since(model_mod.Block.__module__ != "wmtp.model", "91169fb",
            "the blocks live in wmtp/block.py and look add_rms_norm up there, not in wmtp.model")
run(37, {"apart": apart, "fused": fused}, sys.argv)
