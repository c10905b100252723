"""Experiment 40: one split-K program a kv head for the short key ranges of a decode step (the local
layers' 64-key windows, the 8 + 64 draft's 72 keys) against the planner's split-K launch and its
log-sum-exp merge, in the CUDA-graph loop, side by side in one run on the H200.

Experiment 28 (metrics/experiments/short-splits-h200-exp28.json) timed single calls before the
float32 dots became ``tf32x3`` (experiment 32) and found one split 16-73 % slower. This asks the loop
again. Variants (each an override of ``attention_triton``'s launch for key ranges of at most 128
keys, the rest as planned; the overrides are part of the launch-cache key, so no launch of another
variant is reused): ``planner`` (as committed: 4 splits of 32-key blocks for 72 keys, 3 for 64, and a
merge), ``one_split`` (one program, 32-key blocks, no merge) and ``one_split_64`` (one program,
64-key blocks). Splits change the order of the sums, so each variant's speculative tokens are checked
against its own dense tokens. The loop, the models and the figures are
metrics/experiments/side_by_side.py's.

Usage: python3 metrics/experiments/exp40-one-split.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

from side_by_side import run

from wmtp.attention import triton_attention as ta

SHORT = 128  # keys
_planned = ta.attention_triton


def _short(q, n_sink, window) -> bool:
    return window is not None and (n_sink or 0) + window + q.shape[2] - 1 <= SHORT


def _override(**launch):
    def attend(q, k, v, q_pos, n_sink=None, window=None, **kw):
        return _planned(q, k, v, q_pos, n_sink, window, **(launch if _short(q, n_sink, window) else {}), **kw)
    return attend


def planner() -> None:
    ta.attention_triton = _planned


def one_split() -> None:
    ta.attention_triton = _override(num_splits=1)


def one_split_64() -> None:
    ta.attention_triton = _override(num_splits=1, block_n=64)


run(40, {"planner": planner, "one_split": one_split, "one_split_64": one_split_64, "planner_again": planner},
    sys.argv)
