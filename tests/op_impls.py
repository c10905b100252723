"""What the op tests share (tests/test_rmsnorm.py, test_rope.py, test_fused.py): where the Triton
kernels can run (CUDA, or CPU tensors under Triton's interpreter, which tests/conftest.py switches on
when there is no GPU) and the ``impl`` parameters of one parametrized test over both impls."""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if CUDA else "cpu"
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not (CUDA or INTERPRETED),
                                                                  reason="needs CUDA or TRITON_INTERPRET=1"))]
