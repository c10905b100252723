"""What the op tests share (tests/test_rmsnorm.py, test_rope.py, test_fused.py): where the Triton
kernels can run (CUDA, or CPU tensors under Triton's interpreter, which tests/conftest.py switches on
when there is no GPU), the ``impl`` parameters of one parametrized test over both impls, and a spy on
the Triton attention's launches (tests/test_lossless.py, test_model.py, test_query_chunks.py)."""

import os
from typing import NamedTuple

import pytest
import torch

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if CUDA else "cpu"
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not (CUDA or INTERPRETED),
                                                                  reason="needs CUDA or TRITON_INTERPRET=1"))]


class Plan(NamedTuple):
    """One planned Triton attention launch: its key set (``window`` None: the full causal set) and grid."""

    n_sink: int | None
    window: int | None
    grid: tuple


def spy_attention_plans(monkeypatch) -> list[Plan]:
    """Every Triton attention launch planned from now on, so a test can tell that the kernel ran, for
    which key sets, and in how many programs."""
    from wmtp.attention import triton_attention as ta

    plans, plan = [], ta.plan_call

    def spy(*args, **kwargs):
        call = plan(*args, **kwargs)  # plan_call(q, k, v, block_table, page_size, q_pos, n_sink, window, ...)
        plans.append(Plan(args[6], args[7], call.grid))
        return call

    monkeypatch.setattr(ta, "plan_call", spy)
    return plans
