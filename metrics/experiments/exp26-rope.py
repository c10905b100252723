"""Experiment 26: decoding in the CUDA-graph loop with RoPE as one Triton kernel (wmtp/rope.py)
against the reference's eleven-odd kernels a rotation, side by side in one run on the H200.

Variants: ``torch_rope`` (``wmtp.model.rope`` patched to the reference rotation) and
``triton_rope`` (as committed). Both take the frequencies each attention module keeps
(``Attention.frequencies``, new in the same change): the code before it also recomputed them on
every rotation, about four more kernels, so this measures the kernel alone, not the whole change.
Both norm with the Triton kernel (experiment 25). The loop, the models and the figures are
metrics/experiments/side_by_side.py's.

Usage: python3 metrics/experiments/exp26-rope.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import sys

from side_by_side import run, stale_since

from wmtp import model as model_mod
from wmtp import rope as rope_mod


def torch_rope() -> None:
    model_mod.rope = lambda x, pos, inv_freq, impl: rope_mod.rope_torch(x, pos, inv_freq)


def triton_rope() -> None:
    model_mod.rope = rope_mod.rope


stale_since(hasattr(rope_mod, "rope_pair"), "2396f73", "the model rotates through rope_pair, not its own rope name")
run(26, {"torch_rope": torch_rope, "triton_rope": triton_rope}, sys.argv)
