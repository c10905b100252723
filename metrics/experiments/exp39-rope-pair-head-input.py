"""Experiment 39: decoding in the CUDA-graph loop with a layer's query and key rotations as one RoPE
call (``rope_pair`` in wmtp/rope.py, over the stacked q/k/v product's neighbouring heads) and the MTP
head's input row as one kernel (wmtp/head_input.py: the embedding lookup, two norms and the
concatenation), against the ops apart, side by side in one run on the H200.

Variants: ``apart`` (``wmtp.model.rope_pair`` patched to two ``rope`` calls, ``wmtp.mtp.head_input``
to the lookup, the two ``rms_norm`` calls and ``torch.cat``: the kernels of the code before),
``rope_pair`` (the head's input still apart) and ``both`` (as committed). All three give the same
bits (tests/test_rope.py, tests/test_head_input.py). The loop, the models and the figures are
metrics/experiments/side_by_side.py's.

Usage: python3 metrics/experiments/exp39-rope-pair-head-input.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

import torch
import torch.nn.functional as F
from side_by_side import run, stale_since

from wmtp import head_input as head_input_mod
from wmtp import model as model_mod
from wmtp import mtp as mtp_mod
from wmtp import rope as rope_mod
from wmtp.kvcache import KVCache
from wmtp.rmsnorm import rms_norm


def _rope_apart(q, k, pos, f, impl):
    return rope_mod.rope(q, pos, f, impl), rope_mod.rope(k, pos, f, impl)


def _input_apart(hidden, ids, embed, wh, we, eh, ee, impl):
    return torch.cat([rms_norm(hidden, wh, eh, impl), rms_norm(F.embedding(ids, embed), we, ee, impl)], dim=-1)


def apart() -> None:
    model_mod.rope_pair, mtp_mod.head_input = _rope_apart, _input_apart


def rope_pair() -> None:
    model_mod.rope_pair, mtp_mod.head_input = rope_mod.rope_pair, _input_apart


def both() -> None:
    model_mod.rope_pair, mtp_mod.head_input = rope_mod.rope_pair, head_input_mod.head_input


stale_since(hasattr(KVCache, "update_qkv"), "bf17760",
            "the model rotates through qkv_write or prepare_qk (wmtp/qkv_write.py), not through its own rope_pair name")
run(39, {"apart": apart, "rope_pair": rope_pair, "both": both}, sys.argv)
