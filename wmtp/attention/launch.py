"""Cached Triton launches: a kernel's second call skips Triton's per-call specialization (arXiv
2607.21535, Sec. 4: the draft costs microseconds a token, so the launcher's host time shows).

``fn[grid](*args, **kwargs)`` re-derives, on every call, what Triton specializes the kernel on
(each argument's type, each int's value class, each pointer's 16-byte alignment) and looks the
compiled kernel up from that: about 25 us of host time a launch on an H200's host for the draft's
39 arguments then (metrics/experiments/host-h200-exp13.json; the kernel has 46 parameters now, 16
of them constexprs), against about 10 us of device time. The launchers here know which arguments
can change between two calls with the same plan: the ints come from shapes, strides and options
(``static``, a key the caller has already computed), only the tensors' dtypes and alignment remain.
``CachedLaunch`` keys the compiled kernel on ``static`` plus those, compiles and launches through
``fn[grid]`` on a miss, and on a hit launches the compiled kernel directly
(``CompiledKernel[grid]``, the runner ``fn[grid]`` itself ends with).

NOTE [Launch cache]: the key must be at least as fine as Triton's specialization, or a kernel
compiled for other arguments would run. It holds every int exactly (through ``static``), each
tensor's dtype and whether its data pointer is 16-byte aligned (the tensors a caller passes: the
output and workspace the launcher allocates itself have dtypes ``static`` fixes and aligned data,
NOTE [Workspace] in attention/triton_plan.py), and the two runtime settings that
Triton keys its kernels on beside the arguments (``knobs.runtime.debug``, the instrumentation
mode); Triton (3.6, 3.7) specializes ints on ``== 1``, divisibility by 16 and width, pointers on
dtype and 16-byte alignment, so equal keys mean equal specializations (a review checked 4,000
random launches against Triton 3.7.1's own specialization: no conflict).
tests/test_launch_cache.py checks on a GPU that a cache hit is the kernel Triton's own lookup
returns, with aligned and unaligned tensors. A miss checks that the arguments are what the key
assumes (tensors first, then plain ints; the tensors past ``keyed`` 16-byte aligned, which
``plan_call`` also asserts on every call). A hit skips what Triton's path also does and wmtp does
not use: pre-run hooks and the check that the kernel's globals are unchanged; a pipeline-stages
inspection hook turns caching off. Only NVIDIA's backend (ROCm's specializes pointers on more),
only the Triton versions tested (3.6, 3.7: the hit calls ``CompiledKernel[grid]``, an internal),
and only compiled kernels (not the interpreter's, not async compiles) are cached; the cache is
cleared past ``MAX_KERNELS`` keys (a new request length adds about ten).
"""

from __future__ import annotations

import torch
import triton
from triton.compiler import CompiledKernel

__all__ = ["CachedLaunch", "fast_launches"]

TESTED_TRITON = ("3.6.", "3.7.")  # versions whose CompiledKernel[grid] runner the hit path calls
MAX_KERNELS = 4096  # keys kept per kernel before the cache is cleared


class CachedLaunch:
    """``fn`` (a ``triton.jit`` function) launched through a cache of its compiled kernels.

    ``launch(grid, args, kwargs, static, n_tensors, keyed)``: ``args`` are the kernel's positional
    arguments, the first ``n_tensors`` of them tensors and the rest fixed by ``static`` (hashable);
    ``kwargs`` its constexprs and launch options, also fixed by ``static``. The same call as
    ``fn[grid](*args, **kwargs)``. The key holds the dtype and alignment of the first ``keyed``
    tensors (all by default); the caller vouches for the others: dtypes fixed by ``static``, data
    16-byte aligned (the launcher's own fresh allocations: NOTE [Workspace] in attention/triton_plan.py).
    """

    def __init__(self, fn):
        self.fn = fn
        self.kernels: dict = {}  # (static, device, tensor dtypes and alignment) -> (compiled kernel, constexprs)

    def key(self, args: tuple, static, keyed: int) -> tuple:
        """NOTE [Launch cache]: ``static``, the current device, the runtime settings Triton keys on,
        and the dtype and alignment of each of the first ``keyed`` tensors."""
        knobs = triton.knobs
        return (static, torch.cuda.current_device(), getattr(knobs.runtime, "debug", False),
                getattr(knobs.compilation, "instrumentation_mode", ""),
                *((t.dtype, t.data_ptr() % 16 == 0) for t in args[:keyed]))

    def launch(self, grid: tuple, args: tuple, kwargs: dict, static, n_tensors: int, keyed: int | None = None) -> None:
        keyed = n_tensors if keyed is None else keyed
        key = self.key(args, static, keyed)
        hit = self.kernels.get(key)
        if hit is not None:
            kernel, constexprs = hit
            kernel[(*grid, 1, 1)[:3]](*args, *constexprs)  # a 3-d grid; every parameter in order (constexprs skipped)
            return
        assert all(isinstance(a, torch.Tensor) for a in args[:n_tensors]) and all(
            type(a) is int for a in args[n_tensors:]), "CachedLaunch: tensors first, then plain ints"
        assert all(t.data_ptr() % 16 == 0 for t in args[keyed:n_tensors]), \
            "CachedLaunch: tensors past `keyed` must be 16-byte aligned"
        kernel = self.fn[grid](*args, **kwargs)  # Triton's own path: compiles on its first call
        inspecting = getattr(triton.knobs.runtime, "add_stages_inspection_hook", None) is not None
        if isinstance(kernel, CompiledKernel) and not inspecting:
            if len(self.kernels) >= MAX_KERNELS:
                self.kernels.clear()
            constexprs = tuple(kwargs.get(p.name, p.default) for p in self.fn.params[len(args):])  # parameter order
            self.kernels[key] = (kernel, constexprs)


def fast_launches(device: torch.device) -> bool:
    """Whether launches on ``device`` go through ``CachedLaunch``: CUDA on NVIDIA's backend, with a
    Triton version whose launch internals were tested (``TESTED_TRITON``)."""
    return device.type == "cuda" and torch.version.hip is None and triton.__version__.startswith(TESTED_TRITON)
