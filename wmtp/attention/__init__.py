"""Public attention op with an explicit implementation switch (arXiv 2607.21535, Sec. 3).

``attention(q, k, v, q_pos, n_sink, window, impl)`` computes attention of queries at absolute
positions ``q_pos`` over the keys of wmtp/keyset.py's key set. ``impl="torch"`` is the plain
PyTorch reference (attention/reference.py). ``impl="auto"`` resolves once, by device, through
``resolve_impl``. Asking for an implementation that is not available raises ``ValueError``:
there is no silent fallback.
"""

from __future__ import annotations

import torch

from ..keyset import check_key_set_args
from .reference import attention_torch

IMPLS = ("auto", "torch", "triton")

__all__ = ["attention", "resolve_impl", "IMPLS"]


def resolve_impl(impl: str, device: torch.device | str) -> str:
    """Resolve ``impl`` for tensors on ``device`` to a concrete implementation name.

    ``"auto"`` is ``"torch"`` on every device until the Triton kernels land (issue 3).

    Raises:
        ValueError: for an unknown name or an implementation that cannot run here.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if impl == "triton":
        raise ValueError("impl='triton' is not available: the Triton kernels are not part of this build; use impl='torch'")
    return "torch"


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"expected q (B, Hq, Lq, D) and k, v (B, Hkv, S, D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, Hq, Lq, D = q.shape
    if k.shape[0] != B or k.shape[3] != D or Hq % k.shape[1]:
        raise ValueError(f"q {tuple(q.shape)} does not fit k {tuple(k.shape)} (batch, head_dim, Hq % Hkv)")
    if q_pos.shape != (Lq,):
        raise ValueError(f"q_pos must have shape ({Lq},), got {tuple(q_pos.shape)}")
    if Lq and (int(q_pos.min()) < 0 or int(q_pos.max()) >= k.shape[2]):
        raise ValueError(f"query positions must lie in [0, {k.shape[2]}), got [{int(q_pos.min())}, {int(q_pos.max())}]")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    n_sink: int | None = None,
    window: int | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Attention over the Windowed-MTP key set (``window=None``: the full causal set).

    Args:
        q: ``(B, Hq, Lq, D)`` queries.
        k, v: ``(B, Hkv, S, D)`` position-indexed keys and values (``Hq % Hkv == 0``).
        q_pos: ``(Lq,)`` LongTensor of absolute query positions; queries are causal among
            themselves through the key-set formula.
        n_sink: sink keys (``None`` = 0).
        window: recent keys including the query's own (``None`` = full causal set).
        impl: ``"auto"``, ``"torch"`` or ``"triton"``.

    Returns:
        ``(B, Hq, Lq, D)`` tensor in ``q.dtype``.
    """
    check_key_set_args(n_sink, window)
    q_pos = torch.as_tensor(q_pos, dtype=torch.long, device=q.device)
    _check_shapes(q, k, v, q_pos)
    resolve_impl(impl, q.device)
    return attention_torch(q, k, v, q_pos, n_sink, window)
