"""Experiment 30: decoding in the CUDA-graph loop with the narrow float32 launch for long full
ranges (``narrow_fp32`` in wmtp/attention/plan.py, NOTE [Launch]) against the launch before it,
side by side in one run on the H200.

Variants: ``before`` (the planner patched to give a narrow case its former launch: 2 programs an SM,
4 warps, 3 stages) and ``narrow`` (as committed). Only the target's full layers over long contexts
take the narrow launch; the draft's and the local layers' short ranges do not. The loop, the models
and the figures are metrics/experiments/side_by_side.py's.

Run at 85da6e0. The narrow launch was slower in the loop and was reverted right after this run, so
the script runs at that revision only (it needs ``plan.narrow_fp32``).

Usage: python3 metrics/experiments/exp30-narrow-fp32.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

from side_by_side import run

from wmtp.attention import plan, triton_plan


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _before(B, Hq, Hkv, Lq, D, dtype, capacity, n_sink, window, sm_count, num_splits=None, block_n=None,
            num_warps=None, num_stages=None, **kw):
    cfg = plan.launch_config(B, Hq, Hkv, Lq, D, dtype, capacity, n_sink, window, sm_count, num_splits, block_n,
                             num_warps, num_stages, **kw)
    n_keys = capacity if window is None else min(capacity, (n_sink or 0) + window + Lq - 1)
    n_blk = _cdiv(n_keys, cfg.block_n) + (window is not None)
    if (num_splits, num_warps, num_stages) == (None, None, None) and plan.narrow_fp32(
            dtype, cfg.block_m, D, n_blk, cfg.block_n, sm_count):
        splits = max(1, min(n_blk, 2 * sm_count // (B * Hkv)))
        return cfg._replace(num_splits=_cdiv(n_blk, _cdiv(n_blk, splits)), num_warps=4, num_stages=3)
    return cfg


def before() -> None:
    triton_plan.launch_config = _before
    triton_plan._static_plan.cache_clear()


def narrow() -> None:
    triton_plan.launch_config = plan.launch_config
    triton_plan._static_plan.cache_clear()


run(30, {"before": before, "narrow": narrow}, sys.argv)
