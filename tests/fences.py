"""``fenced``: a stand-in for a kernel's output inside NaN fences, to catch writes past its ends.

A Triton kernel that stores past its output corrupts whatever sits there on a GPU, silently, and may
crash the CPU interpreter instead of failing a test. tests/test_triton_bounds.py and test_fused.py
launch kernels on these stand-ins and check that both fences are still all NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def fenced(t: torch.Tensor) -> tuple[torch.Tensor, Callable[[], bool]]:
    """An uninitialised stand-in for ``t`` (a dense tensor: its storage is its elements), with
    ``t``'s shape and strides, inside a NaN buffer with about ``t.numel()`` spare elements on each
    side (a multiple of 16, which keeps the kernels' 16-byte alignment). Returns the stand-in, NaN
    itself, and a check that both spare regions are still all NaN."""
    n = t.numel()
    assert t.untyped_storage().nbytes() == n * t.element_size(), "a dense tensor"
    spare = n + 16 - n % 16
    buf = torch.full((spare + n + spare,), float("nan"), dtype=t.dtype, device=t.device)
    return buf[spare:].as_strided(t.shape, t.stride()), lambda: bool(buf[:spare].isnan().all()
                                                                     and buf[spare + n :].isnan().all())
