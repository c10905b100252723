"""Paged KV-cache attention in plain PyTorch: the reference for the paged Triton kernel.

A paged cache stores keys and values in fixed-size pages, ``k_pages, v_pages`` of shape
``(num_pages, page_size, Hkv, D)``, and a block table ``(B, max_pages)`` (int32) maps logical key
position ``p`` of sequence ``b`` to row ``p % page_size`` of page ``block_table[b, p // page_size]``
(the vLLM layout). The key set is the one of wmtp/keyset.py (arXiv 2607.21535, Sec. 3).

``paged_attention_torch`` hands ``attention_torch`` a ``PagedView`` of the pages: a position-indexed
``(B, Hkv, S, D)`` view whose slices ``[:, :, a:b]`` gather positions ``a .. b-1`` through the block
table. The reference reads only its key set's ranges, so only those rows are gathered: a windowed
draft over a paged cache (or the ring of wmtp/ringcache.py, pages of one row) costs its key set, not
the context. ``paginate`` builds a paged cache from a contiguous one, with randomly permuted
pages, for tests and benchmarks.
"""

from __future__ import annotations

import torch

from .reference import attention_torch

__all__ = ["PagedView", "page_rows", "paged_attention_torch", "paginate"]


def page_rows(block_table: torch.Tensor, page_size: int, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """THE paged address of positions ``pos`` ``(L,)`` (every sequence's) or ``(B, L)`` (each its own):
    page ``(B, L)`` and row ``(L,)`` or ``(B, L)``, position ``p`` of sequence ``b`` being row
    ``p % page_size`` of page ``block_table[b, p // page_size]``."""
    pos = pos.long()
    if pos.dim() == 2:
        return block_table.gather(1, pos // page_size).long(), pos % page_size  # (B, L) each
    return block_table[:, pos // page_size].long(), pos % page_size


class PagedView:
    """Positions ``0 .. length-1`` of a paged cache as ``attention_torch`` reads a ``(B, Hkv, length, D)``
    cache: ``.shape``, and slices ``[batch, heads, a:b]`` gathered from the pages on demand."""

    def __init__(self, pages: torch.Tensor, block_table: torch.Tensor, length: int) -> None:
        self.pages, self.block_table = pages, block_table  # (num_pages, page_size, Hkv, D), (B, max_pages)
        self.shape = (block_table.shape[0], pages.shape[2], length, pages.shape[3])

    def __getitem__(self, index) -> torch.Tensor:
        batch, heads, positions = index
        if isinstance(positions, slice):  # the reference's ranges: only their positions, not 0 .. length-1
            pos = torch.arange(*positions.indices(self.shape[2]), device=self.pages.device)  # (L,)
        else:
            pos = torch.arange(self.shape[2], device=self.pages.device)[positions]  # (L,)
        page, row = page_rows(self.block_table[batch], self.pages.shape[1], pos)  # (B, L), (L,)
        return self.pages[page, row].permute(0, 2, 1, 3)[:, heads]  # (B, L, Hkv, D) -> (B, Hkv, L, D)


def paged_attention_torch(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    q_pos: torch.Tensor,
    n_sink: int | None = None,
    window: int | None = None,
    q_sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over the key set, with keys and values in a paged cache.

    Args:
        q: ``(B, Hq, Lq, D)`` queries.
        k_pages, v_pages: ``(num_pages, page_size, Hkv, D)`` pages of keys and values.
        block_table: ``(B, max_pages)`` page of each sequence's logical page (int32).
        q_pos: ``(Lq,)`` absolute query positions, each ``< max_pages * page_size``, or ``(B, Lq)``:
            each batch row's own (computed row by row).
        n_sink: sink keys (``None`` = 0).
        window: recent keys including the query's own (``None`` = full causal set).
        q_sink: queries that score the sink keys, as in ``attention_torch``.

    Returns:
        ``(B, Hq, Lq, D)`` in ``q.dtype``.
    """
    if q_pos.numel() == 0:
        return torch.empty_like(q)
    if q_pos.dim() == 2:  # positions per row: each row alone, through its own block-table row
        return torch.cat([paged_attention_torch(q[b : b + 1], k_pages, v_pages, block_table[b : b + 1], q_pos[b],
                                                n_sink, window, None if q_sink is None else q_sink[b : b + 1])
                          for b in range(q.shape[0])])
    length = int(q_pos.max()) + 1  # positions past the last query are never read
    k, v = PagedView(k_pages, block_table, length), PagedView(v_pages, block_table, length)
    return attention_torch(q, k, v, q_pos, n_sink, window, q_sink)


def paginate(
    k: torch.Tensor, v: torch.Tensor, page_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scatter a contiguous cache into randomly permuted pages.

    Args:
        k, v: ``(B, Hkv, S, D)`` contiguous keys and values.
        page_size: rows per page (``>= 1``).
        generator: draws the page permutation.

    Returns:
        ``k_pages, v_pages`` ``(B * ceil(S / page_size), page_size, Hkv, D)`` and ``block_table``
        ``(B, ceil(S / page_size))`` int32 on ``k.device``. Rows past ``S`` in a last, partly used
        page are zero.
    """
    B, Hkv, S, D = k.shape
    n_pages = -(-S // page_size)  # pages per sequence
    perm = torch.randperm(B * n_pages, generator=generator, device=generator.device).to(k.device)
    block_table = perm.view(B, n_pages).to(torch.int32)  # (B, n_pages)

    def scatter(x: torch.Tensor) -> torch.Tensor:
        padded = x.new_zeros(B, Hkv, n_pages * page_size, D)
        padded[:, :, :S] = x
        logical = padded.view(B, Hkv, n_pages, page_size, D).permute(0, 2, 3, 1, 4)  # (B, n_pages, page, Hkv, D)
        pages = x.new_empty(B * n_pages, page_size, Hkv, D)
        pages[perm] = logical.reshape(B * n_pages, page_size, Hkv, D)
        return pages

    return scatter(k), scatter(v), block_table
