"""A paged KV cache for decoding: keys and values in fixed-size pages from one pool, addressed
through a block table (the vLLM layout; beyond arXiv 2607.21535, Sec. 3, whose draft reads the key
set of a paged cache in place as it reads a contiguous one).

Position ``p`` of sequence ``b`` is row ``p % page_size`` of page ``block_table[b, p // page_size]``,
as the paged attention op (wmtp/attention/paged.py, the Triton kernel's ``PAGED`` launches) reads
it. The pages of a sequence are drawn from the pool in a random order (an explicit generator), so
nothing downstream can lean on them being contiguous. The interface is ``KVCache``'s
(wmtp/kvcache.py): ``update`` writes positions, ``attend`` runs attention over them, ``read``
returns positions, ``copy``, ``nbytes``; the same position-indexed protocol, so rejected drafts need
no rollback (NOTE [No rollback] there). ``prefill_prompt(..., page_size=...)`` (wmtp/prefill.py)
builds the target's and the draft's caches this way, and every run from that prefill decodes on
copies of them.
"""

from __future__ import annotations

import torch

from .attention import paged_attention
from .attention.paged import page_rows
from .kvcache import check_write

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Keys and values of ``n_layers`` layers in pages of ``page_size`` positions.

    Args:
        n_layers, batch, n_kv_heads, max_len, head_dim: as ``KVCache``'s; the block table addresses
            ``ceil(max_len / page_size)`` pages a sequence.
        page_size: positions a page holds (>= 1).
        generator: orders the pool's pages among the sequences (default: seeded with 0).
        dtype, device, checked: as ``KVCache``'s.

    Raises:
        ValueError: for a size below 1.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *, page_size: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", checked: bool = True,
                 generator: torch.Generator | None = None) -> None:
        for name, value in (("n_layers", n_layers), ("batch", batch), ("max_len", max_len), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.checked, self.max_len, self.page_size = checked, max_len, page_size
        pages = -(-max_len // page_size)  # a sequence's pages
        shape = (n_layers, batch * pages, page_size, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (n_layers, num_pages, page_size, Hkv, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        order = torch.randperm(batch * pages, generator=generator or torch.Generator().manual_seed(0))
        self.block_table = order.view(batch, pages).to(device=device, dtype=torch.int32)  # (B, pages)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held (the block table aside)."""
        return self.k.nbytes + self.v.nbytes

    def copy(self, checked: bool | None = None) -> PagedKVCache:
        """A new cache holding copies of these pages (the block table shared: never written)."""
        new = PagedKVCache.__new__(PagedKVCache)
        new.__dict__.update(self.__dict__)
        new.checked = self.checked if checked is None else checked
        new.k, new.v = self.k.clone(), self.v.clone()
        return new

    def update(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k, v`` ``(B, Hkv, L, D)`` at positions ``pos`` ``(L,)``.

        Raises:
            ValueError: as ``KVCache.update``.
        """
        n_layers, _, _, Hkv, D = self.k.shape
        check_write(layer, pos, k, v, (n_layers, self.block_table.shape[0], Hkv, D),
                    self.max_len if self.checked else None)
        page, row = page_rows(self.block_table, self.page_size, pos)  # (B, L), (L,)
        self.k[layer][page, row] = k.transpose(1, 2).to(self.k.dtype)  # (B, L, Hkv, D) into (B, L) rows
        self.v[layer][page, row] = v.transpose(1, 2).to(self.v.dtype)

    def read(self, layer: int, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(B, Hkv, L, D)`` at positions ``pos`` ``(L,)`` (a gathered copy)."""
        page, row = page_rows(self.block_table, self.page_size, pos)  # (B, L), (L,)
        return self.k[layer][page, row].transpose(1, 2), self.v[layer][page, row].transpose(1, 2)

    def attend(self, layer: int, q: torch.Tensor, pos: torch.Tensor, n_sink: int | None, window: int | None,
               impl: str, q_sink: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of queries ``q`` ``(B, Hq, Lq, D)`` at ``pos`` over the key set ``(n_sink, window)``,
        read in place through the block table (``paged_attention``)."""
        return paged_attention(q, self.k[layer], self.v[layer], self.block_table, pos, n_sink, window, impl,
                               q_sink=q_sink)
