"""Experiment 35: decoding in the CUDA-graph loop with the global layers' log-length scaling and
SwiGLU's activation as one Triton kernel each (wmtp/fused.py) against the references' kernels
(six a scaling, two an activation), side by side in one run on the H200.

Variants: ``reference`` (``wmtp.model.logn_scale`` and ``silu_mul`` patched to the references),
``logn`` (the scaling's kernel, the activation's reference) and ``logn+silu`` (both kernels, as
committed). The loop, the models and the figures are metrics/experiments/side_by_side.py's; it
reports the last variant against the first.

Usage: python3 metrics/experiments/exp35-fused-ops.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

from side_by_side import run, stale_since

from wmtp import fused
from wmtp import model as model_mod
from wmtp.kvcache import KVCache


def reference() -> None:
    model_mod.logn_scale = lambda q, pos, train_len, impl: fused.logn_scale_torch(q, pos, train_len)
    model_mod.silu_mul = lambda gate, up, impl: fused.silu_mul_torch(gate, up)


def logn() -> None:
    model_mod.logn_scale = fused.logn_scale


def logn_silu() -> None:
    model_mod.logn_scale, model_mod.silu_mul = fused.logn_scale, fused.silu_mul


stale_since(hasattr(KVCache, "update_qkv"), "bf17760",
            "a contiguous cache's layer scales its queries inside qkv_write (wmtp/qkv_write.py), "
            "not through the model's logn_scale")
run(35, {"reference": reference, "logn": logn, "logn+silu": logn_silu}, sys.argv)
