"""Weights that read one input, stacked into one matrix: one product where there were several.

A block's attention multiplies its normed input by three weights (queries, keys, values) and its
SwiGLU by two (gate, up) (arXiv 2607.21535, Sec. 2: the MTP head is one such block). In a decode
step each product is a one-row gemv or a few-row GEMM that a CUDA graph replays in a few
microseconds, however little it computes (docs/results/step-anatomy.md), so ``Attention`` and
``MLP`` in wmtp/model.py make them one product of the weights stacked by rows and split its output:
``x @ cat([wq, wk, wv]).T`` is ``cat([x @ wq.T, x @ wk.T, x @ wv.T])`` in exact arithmetic.

In floating point the stacked product can sum in another order (cuBLAS picks a kernel by shape), so
its outputs match the separate products to rounding, not bit for bit; every decoding path of a model
takes the same route, which is all losslessness needs (decode.py NOTE [Exactness]). Side by side on
the H200 (experiment 38, metrics/experiments/stacked-h200-exp38.json, the CUDA-graph loop): dense
decoding takes 8.6-18.3 % less time a token, speculative decoding 6.9-13.8 % less.

NOTE [Stacked weights]: the parameters stay separate (checkpoints, training and the CPU's numbers do
not change); ``WeightStack`` keeps their concatenation, a second copy of those weights, and builds it
again when any of them changes: a new tensor (``.to()``, ``param.data = ...``: a new data pointer;
the stack keeps the old tensors alive, so no new one can take their address) or an in-place update
(an optimizer step, ``load_state_dict``: the version counter). It is not kept when first built while a
CUDA graph is being captured: the graph's warm-up builds it before capture (wmtp/static_decode.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["WeightStack", "stacks"]


def stacks(impl: str, x: torch.Tensor, weights: list[torch.Tensor]) -> bool:
    """Whether ``x``'s products with ``weights`` go stacked: on CUDA, the small ops' ``impl`` (``op_impl``
    in wmtp/model.py) not ``"torch"``, and no weight needs a gradient (the stack is detached)."""
    needs_grad = torch.is_grad_enabled() and any(w.requires_grad for w in weights)
    return x.is_cuda and impl != "torch" and not needs_grad


class WeightStack:
    """The parameters ``names`` of a module, concatenated along their rows and kept (NOTE [Stacked weights]).

    Args:
        names: attribute names of 2-D parameters with one number of columns.
    """

    def __init__(self, *names: str) -> None:
        if not names:
            raise ValueError("a WeightStack needs at least one parameter name")
        self.names = names
        self._key: tuple | None = None
        self._sources: list[torch.Tensor] = []  # the stacked tensors, kept alive (their addresses stay taken)
        self._stack: torch.Tensor | None = None

    def weights(self, module: nn.Module) -> list[torch.Tensor]:
        """The parameters, in order."""
        return [getattr(module, n) for n in self.names]

    def sizes(self, module: nn.Module) -> list[int]:
        """Each parameter's number of rows: the stacked product's output splits."""
        return [w.shape[0] for w in self.weights(module)]

    def get(self, module: nn.Module) -> torch.Tensor:
        """The stacked weight ``(sum of rows, in)``, built again if any parameter changed."""
        ws = self.weights(module)
        key = tuple((w.data_ptr(), w._version, w.dtype, w.device, tuple(w.shape)) for w in ws)
        if key == self._key:
            return self._stack
        stack = torch.cat([w.detach() for w in ws])  # (sum of rows, in)
        if not (stack.is_cuda and torch.cuda.is_current_stream_capturing()):
            self._key, self._sources, self._stack = key, [w.detach() for w in ws], stack
        return stack

    def __deepcopy__(self, memo: dict) -> WeightStack:
        """A fresh, empty stack: a copy of a module stacks its own parameters."""
        return WeightStack(*self.names)
