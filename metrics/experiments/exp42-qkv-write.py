"""Experiment 42: decoding in the CUDA-graph loop with each layer's query preparation (the local
layers' and the head's rotation, the global layers' log-length scaling), key rotation and cache write
as one kernel (``qkv_write``, wmtp/qkv_write.py), against the separate ops (``rope_pair`` or
``logn_scale``, then ``kv_write``: two kernels a layer), side by side in one run on the H200.

Variants: ``apart`` (``KVCache.update_qkv`` patched to ``SeparateWrites.update_qkv``, the ring and
paged caches' path: the kernels of the code before) and ``one_kernel`` (as committed). Both give the
same bits (tests/test_qkv_write.py). The loop, the models and the figures are
metrics/experiments/side_by_side.py's.

Usage: python3 metrics/experiments/exp42-qkv-write.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

from side_by_side import run

from wmtp.kvcache import KVCache, SeparateWrites

ONE_KERNEL = KVCache.update_qkv


def apart() -> None:
    KVCache.update_qkv = SeparateWrites.update_qkv


def one_kernel() -> None:
    KVCache.update_qkv = ONE_KERNEL


run(42, {"apart": apart, "one_kernel": one_kernel}, sys.argv)
