"""What the op tests share (tests/test_rmsnorm.py, test_rope.py, test_fused.py): where the Triton
kernels can run (CUDA, or CPU tensors under Triton's interpreter, which tests/conftest.py switches on
when there is no GPU), the ``impl`` parameters of one parametrized test over both impls, and a spy on
the Triton attention's launches (tests/test_lossless.py, test_model.py)."""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if CUDA else "cpu"
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not (CUDA or INTERPRETED),
                                                                  reason="needs CUDA or TRITON_INTERPRET=1"))]


def spy_attention_key_sets(monkeypatch) -> list:
    """``(n_sink, window)`` of every Triton attention launch planned from now on (``window`` None: the
    full causal key set), so a test can tell that the kernel ran, and for which key sets."""
    from wmtp.attention import triton_attention as ta

    key_sets, plan = [], ta.plan_call

    def spy(*args, **kwargs):
        key_sets.append(args[6:8])  # plan_call(q, k, v, block_table, page_size, q_pos, n_sink, window, ...)
        return plan(*args, **kwargs)

    monkeypatch.setattr(ta, "plan_call", spy)
    return key_sets
