"""Products of the model's weights: ``linear``, with products of few rows on CUDA routed to cuBLASLt,
and ``project``, one product of a module's stacked weights where they stack (arXiv 2607.21535,
Sec. 5: a verify pass multiplies ``depth + 1`` rows by every weight of the target).

NOTE [Few-row products]: a verify pass multiplies ``depth + 1`` rows by every weight, the draft's
extend up to as many. For 7 to 12 float32 rows cuBLAS picks an FFMA GEMM that takes 24-32 µs a call
on the H200 for four of the small preset's five shapes (not the LM head's), where one row's gemv
takes 2-3 µs (experiment 17 found 770 of a verify pass's 1284 µs in them; experiment 23,
metrics/experiments/skinny-matmul-h200-exp23-rows.json, times each shape at 1-10, 12 and 16 rows).
``linear`` hands a product of 2 to ``FEW_ROWS`` rows on CUDA to ``addmm`` with a zero bias, which
PyTorch runs in cuBLASLt: 2.5-4.5 µs for those four shapes at 7-12 rows (the LM head's 4.5-6.3 µs,
where cuBLAS took 4.5-8.1; its ``-zero-bias.json`` and ``-rows.json``), a full-precision float32
product (no TF32) as accurate as cuBLAS's, though not bit-identical to it, and no process-wide
setting touched. It was timed in float32 only; other dtypes take the same route (the CUDA tests run
it in float64). One row (dense decoding) and more than ``FEW_ROWS`` (a longer prefill) are left to
``F.linear``, and so is every product off CUDA: the CPU's numbers do not move. End to end
(experiment 24, metrics/experiments/few-rows-h200-exp24.json, the CUDA-graph loop) the verify phase
takes 37-64.5 % less time and speculative TPOT 16-40 % less. The zero biases are non-persistent
buffers: no checkpoint holds them, and loading one zeroes them again (``rezero``), so a model built
on the meta device and filled by ``load_state_dict`` cannot add garbage.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .stacked import StackedWeights, stacked_view, stacks

FEW_ROWS = 16  # NOTE [Few-row products]: on CUDA, products of 2 .. FEW_ROWS rows go through cuBLASLt


def zero_bias(n: int) -> torch.Tensor:
    """A zero bias of ``n`` entries for ``linear``, to register as a non-persistent buffer."""
    return torch.zeros(n)


def rezero(module: nn.Module, *_) -> None:
    """Zero every ``zero`` buffer of ``module`` (a ``load_state_dict`` post-hook: NOTE [Few-row products])."""
    with torch.no_grad():
        for name, b in module.named_buffers():
            if name.rsplit(".", 1)[-1] == "zero":
                b.zero_()


def few_rows(x: torch.Tensor, rows: int) -> bool:
    """Whether ``linear`` routes a product of ``rows`` rows of ``x`` through ``addmm``: on CUDA, 2 to
    ``FEW_ROWS`` rows (NOTE [Few-row products])."""
    return x.is_cuda and 1 < rows <= FEW_ROWS


def linear(x: torch.Tensor, w: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """``x @ w.T``, as ``F.linear(x, w)``; a product of few rows on CUDA as ``addmm`` with a zero bias,
    which PyTorch runs in cuBLASLt (NOTE [Few-row products]).

    Args:
        x: ``(..., in)`` inputs (any layout).
        w: ``(out, in)`` weight.
        zero: zeros of ``w``'s dtype and device, at least ``out`` of them (a module's ``zero`` buffer).

    Returns:
        ``(..., out)``.

    Raises:
        ValueError: if ``zero`` is of another dtype or device than ``w``, or shorter than ``out``.
    """
    if zero.dtype != w.dtype or zero.device != w.device or zero.numel() < w.shape[0]:  # on every path, used or not
        raise ValueError(f"linear's zero bias must be {w.dtype} on {w.device} with at least {w.shape[0]} entries, "
                         f"got {zero.dtype} on {zero.device} with {zero.numel()} (convert the module, not its "
                         "parameters alone)")
    rows = x.numel() // x.shape[-1]
    if not few_rows(x, rows):
        return F.linear(x, w)
    out = F.linear(x.reshape(rows, x.shape[-1]), w, zero[: w.shape[0]])  # (rows, out): addmm
    return out.view(*x.shape[:-1], w.shape[0])


def project(module: StackedWeights, x: torch.Tensor, impl: str) -> tuple[torch.Tensor, ...]:
    """``x`` times each weight of ``module.STACK``: one product of the stacked weights when ``stacks``
    says so and they are packed (NOTE [Stacked weights] in wmtp/stacked.py; the outputs are then views
    of one tensor), else one ``linear`` each. ``impl`` is the small ops' (``op_impl``)."""
    ws = [getattr(module, n) for n in module.STACK]
    w = stacked_view(ws) if stacks(impl, x, ws) else None  # (sum of outs, in)
    if w is None:
        return tuple(linear(x, wi, module.zero) for wi in ws)
    return linear(x, w, module.zero).split([wi.shape[0] for wi in ws], dim=-1)  # (..., out) each
