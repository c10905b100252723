"""Argument checks of the public attention ops (wmtp/attention/__init__.py): shapes, positions, page ids,
query-sink queries, and what the Triton kernels cannot take. The checks raise ``ValueError`` with one
line; ``triton_refuses`` returns the reason instead. Values are read only where that costs no wait for the GPU
(NOTE [Host checks]; the kernel's launcher reads none: NOTE [Host sync] in
attention/triton_attention.py). Library plumbing around the key set of arXiv 2607.21535, Sec. 3.
"""

from __future__ import annotations

import torch

from ..checks import check_tensors
from .plan import MAX_POSITIONS


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor) -> int:
    """Shapes only (no values: no sync); returns the query heads per kv head."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"expected q (B, Hq, Lq, D) and k, v (B, Hkv, S, D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, Hq, Lq, D = q.shape
    if not B or not Hq or not D:
        raise ValueError(f"q {tuple(q.shape)} has an empty batch, head or head dimension")
    if k.shape[0] != B or k.shape[3] != D or not k.shape[1] or Hq % k.shape[1]:
        raise ValueError(f"q {tuple(q.shape)} does not fit k {tuple(k.shape)} (batch, head_dim, Hq % Hkv)")
    if k.shape[2] == 0:
        raise ValueError("the cache holds no positions (S = 0)")
    if q_pos.shape != (Lq,) and q_pos.shape != (B, Lq):
        raise ValueError(f"q_pos must have shape ({Lq},) or ({B}, {Lq}), got {tuple(q_pos.shape)}")
    return Hq // k.shape[1]


def check_positions(impl: str, q_pos: torch.Tensor, S: int) -> None:
    """NOTE [Host checks]: query positions are range-checked on the host when that costs no wait:
    always for the reference (it reads them anyway) and for positions given in host memory. The
    Triton path with positions already on the GPU is not checked, so a call never waits for the
    device; the kernel clamps positions to the cache, so a bad one cannot read outside it."""
    if q_pos.numel() and (impl == "torch" or q_pos.device.type == "cpu"):
        lo, hi = (int(q_pos),) * 2 if q_pos.numel() == 1 else (int(q_pos.min()), int(q_pos.max()))
        if lo < 0 or hi >= S:
            raise ValueError(f"query positions must lie in [0, {S}), got [{lo}, {hi}]")


def check_pages(impl: str, block_table: torch.Tensor, q_pos: torch.Tensor, num_pages: int, page_size: int) -> None:
    """NOTE [Host checks], as for positions: the pages the queries can reach (``0 .. max(q_pos)``, a
    row's own with positions per row) must lie in ``[0, num_pages)``; checked for the reference and
    for a table in host memory. (A negative page id would index from the end in torch: another page,
    silently.)"""
    if q_pos.numel() and (impl == "torch" or block_table.device.type == "cpu"):
        if q_pos.dim() == 1:  # every row reads the same pages: a view of the table's first columns
            used = block_table[:, : int(q_pos.max()) // page_size + 1]  # (B, pages read)
        else:
            reach = q_pos.amax(dim=-1).to(block_table.device) // page_size + 1  # (B,): pages each row reads
            cols = torch.arange(block_table.shape[1], device=block_table.device)  # (max_pages,)
            used = block_table[(cols < reach.reshape(-1, 1)).expand(block_table.shape)]  # the pages read
        lo, hi = int(used.min()), int(used.max())
        if lo < 0 or hi >= num_pages:
            raise ValueError(f"block_table's pages for positions up to {int(q_pos.max())} must lie in "
                             f"[0, {num_pages}), got [{lo}, {hi}]")


def triton_refuses(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_sink: torch.Tensor | None,
                   capacity: int = 0) -> str | None:
    """What the Triton kernels cannot take beyond dtype and shape, or ``None``: they read k and v in
    place (one layout, a contiguous head dim), in q's dtype, from a cache of at most ``MAX_POSITIONS``
    key positions (``capacity``: S, or the block table's pages times the page size; int32 positions),
    and have no backward."""
    if capacity > MAX_POSITIONS:
        return f"a cache of {capacity} key positions (the kernels' positions are int32: at most 2**30)"
    if not q.dtype == k.dtype == v.dtype:
        return f"q, k, v of different dtypes ({q.dtype}, {k.dtype}, {v.dtype})"
    if k.stride(-1) != 1 or k.stride() != v.stride():
        return f"k and v of two layouts or a strided head dim (strides {k.stride()}, {v.stride()})"
    grads = q.requires_grad or k.requires_grad or v.requires_grad or (q_sink is not None and q_sink.requires_grad)
    if torch.is_grad_enabled() and grads:
        return "tensors that require grad (the kernels have no backward)"
    return None


def check_q_sink(q: torch.Tensor, q_sink: torch.Tensor | None, window: int | None) -> None:
    """``q_sink`` must match ``q`` (shape, dtype, device) and needs sinks to score (a window)."""
    if q_sink is None:
        return
    check_tensors(q_sink=q_sink)
    if window is None:
        raise ValueError("q_sink scores the sink keys of a windowed key set; window=None has none")
    if q_sink.shape != q.shape or q_sink.dtype != q.dtype or q_sink.device != q.device:
        raise ValueError(f"q_sink must match q: got {tuple(q_sink.shape)} {q_sink.dtype} on {q_sink.device}, "
                         f"q is {tuple(q.shape)} {q.dtype} on {q.device}")
