"""Experiment 36: decoding in the CUDA-graph loop with a layer's key and value cache writes as one
Triton kernel (``kv_write`` in wmtp/fused.py) against the two indexed assignments before it, side by
side in one run on the H200.

Variants: ``indexed`` (``wmtp.kvcache.kv_write`` patched to the reference) and ``kernel`` (as
committed). Contiguous caches only: the runs' caches are (the ring and paged caches keep their
indexed writes). The loop, the models and the figures are metrics/experiments/side_by_side.py's.

Usage: python3 metrics/experiments/exp36-kv-write.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

from side_by_side import run, stale_since

from wmtp import fused, kvcache
from wmtp.kvcache import KVCache


def indexed() -> None:
    kvcache.kv_write = lambda k_buf, v_buf, pos, k, v, impl: fused.kv_write_torch(k_buf, v_buf, pos, k, v)


def kernel() -> None:
    kvcache.kv_write = fused.kv_write


stale_since(hasattr(KVCache, "update_qkv"), "bf17760",
            "a contiguous cache writes through qkv_write (wmtp/qkv_write.py), not through kvcache.kv_write")
run(36, {"indexed": indexed, "kernel": kernel}, sys.argv)
