"""Weights that read one input, stacked into one matrix: one product where there were several.

A block's attention multiplies its normed input by three weights (queries, keys, values) and its
SwiGLU by two (gate, up) (arXiv 2607.21535, Sec. 2: the MTP head is one such block). In a decode
step each product is a one-row gemv or a few-row GEMM that a CUDA graph replays in a few
microseconds, however little it computes (docs/results/step-anatomy.md), so ``Attention`` and
``MLP`` in wmtp/block.py make them one product of the weights stacked by rows and split its output:
``x @ cat([wq, wk, wv]).T`` is ``cat([x @ wq.T, x @ wk.T, x @ wv.T])`` in exact arithmetic.

In floating point the stacked product can sum in another order (cuBLAS picks a kernel by shape), so
its outputs match the separate products to rounding, not bit for bit; every decoding path of a model
takes the same route, which is all losslessness needs (decode.py NOTE [Exactness]). Side by side on
the H200 (experiment 38, metrics/experiments/stacked-h200-exp38.json, the CUDA-graph loop): dense
decoding takes 8.6-18.3 % less time a token, speculative decoding 6.9-13.8 % less.

NOTE [Stacked weights]: the parameters stay separate ``nn.Parameter``s (names, checkpoints, training
and the CPU's numbers do not change), but their data are neighbouring rows of one tensor (``pack``),
so the stacked matrix is a view of them (``stacked_view``): nothing is copied or cached, and every
in-place update (an optimizer step of any kind, ``load_state_dict``, a write through ``.data``) is
seen at once. A conversion (``.to()``, ``.double()``, ``to_empty``) gives each parameter a tensor of
its own; the modules pack them again after it (their ``_apply``) and after ``load_state_dict(...,
assign=True)``. Anything else that leaves them apart (``copy.deepcopy``, ``param.data = t``, a new
``nn.Parameter``) makes ``stacked_view`` return ``None`` and the products run one per weight: slower,
never stale. ``pack`` is not for a CUDA graph's capture (it allocates and copies).
"""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["StackedWeights", "pack", "repack", "stacked_view", "stacks"]


def stacks(impl: str, x: torch.Tensor, weights: list[torch.Tensor]) -> bool:
    """Whether ``x``'s products with ``weights`` go stacked: on CUDA, the small ops' ``impl`` (``op_impl``
    in wmtp/block.py) not ``"torch"``, and no weight needs a gradient (the stacked view is detached;
    a gradient for ``x`` is fine)."""
    needs_grad = torch.is_grad_enabled() and any(w.requires_grad for w in weights)
    return x.is_cuda and impl != "torch" and not needs_grad


def stacked_view(weights: list[torch.Tensor]) -> torch.Tensor | None:
    """``cat(weights)`` ``(sum of rows, in)`` as a detached view, when the 2-D ``weights`` are
    neighbouring rows of one tensor with unit column stride (as ``pack`` leaves them); else ``None``."""
    w0 = weights[0]
    if w0.dim() != 2:
        return None
    cols, offset = w0.shape[1], w0.storage_offset()
    for w in weights:
        if (w.dim() != 2 or w.shape[1] != cols or w.stride() != (cols, 1) or w.storage_offset() != offset
                or (w.dtype, w.device) != (w0.dtype, w0.device)
                or w.untyped_storage().data_ptr() != w0.untyped_storage().data_ptr()):
            return None
        offset += w.shape[0] * cols
    return w0.detach().as_strided((sum(w.shape[0] for w in weights), cols), (cols, 1))  # (rows, in)


def pack(module: nn.Module, names: tuple[str, ...]) -> None:
    """Make the parameters ``names`` of ``module`` neighbouring rows of one new tensor, values kept (a
    no-op when they already are, or when their dtypes, devices or column counts differ)."""
    ws = [getattr(module, n) for n in names]
    if stacked_view(ws) is not None or not all(isinstance(w, nn.Parameter) and w.dim() == 2 for w in ws):
        return
    if len({(w.dtype, w.device, w.shape[1]) for w in ws}) != 1:
        return
    with torch.no_grad():
        buf = torch.cat([w.detach() for w in ws])  # (sum of rows, in), contiguous
        start = 0
        for w in ws:
            w.data = buf[start:start + w.shape[0]]  # the same Parameter object, its data a view of buf
            start += w.shape[0]


def repack(module: nn.Module, *_) -> None:
    """``pack`` ``module``'s ``STACK`` (a ``load_state_dict`` post-hook: ``assign=True`` replaces tensors)."""
    pack(module, module.STACK)


class StackedWeights(nn.Module):
    """A module whose parameters ``STACK`` stay packed across conversions (NOTE [Stacked weights]).
    Subclasses create them, then call ``keep_packed``."""

    STACK: tuple[str, ...] = ()

    def keep_packed(self) -> None:
        pack(self, self.STACK)
        self.register_load_state_dict_post_hook(repack)

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        pack(self, self.STACK)
        return self
