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
builds the target's and the draft's caches this way, and every run from that prefill decodes on a
fork of them.

NOTE [Forks]: ``fork(filled, needed)`` is a cache for one more run from these positions ``0 ..
filled-1``, as vLLM shares a prompt's blocks among the sequences that continue it. The fork's block
table addresses this cache's pages wholly below ``filled`` (shared, never written again: a run
writes only positions ``>= filled``, NOTE [No rollback]) and pages of its own for the positions
``filled .. needed-1`` it writes; the page holding ``filled`` is copied first when ``filled`` is
not a page boundary (copy on write). Its own pages come from the pool's free pages: the pages
this cache's block table addresses past ``filled`` and one spare page a sequence (the pool holds
them for that copy). They return to the free pages when the fork is garbage collected, so runs
one after another take the same few pages, and at a million tokens a run adds its new tokens'
pages instead of a second copy of the cache. Its table's entries past ``needed`` address one
scratch page that no correct run writes (tests check it stays zero). The first fork freezes this
cache at ``filled``: it is read-only from then on, as a ``Prefill``'s caches are.
"""

from __future__ import annotations

import gc
import weakref

import torch

from .attention import paged_attention
from .attention.paged import page_rows
from .checks import check_int
from .kvcache import SeparateWrites, check_impl, check_read, check_write

__all__ = ["PagedKVCache", "fork_pages", "fork_table"]


def fork_pages(filled: int, needed: int, page_size: int) -> tuple[int, int]:
    """``(first, own)``: a fork (NOTE [Forks]) writes the logical pages ``first .. first + own - 1``
    of its own, those holding positions ``filled .. needed-1`` and the one holding ``filled``
    (``first = filled // page_size``; copied when ``filled`` is not a page boundary, since its rows
    below ``filled`` are shared positions): ``own = ceil(needed / page_size) - first``, which for
    ``0 <= filled < needed`` covers that page too (``filled == needed`` on a page boundary owns
    none: nothing is written)."""
    first = filled // page_size
    return first, -(-needed // page_size) - first


def fork_table(block_table: torch.Tensor, page_size: int, filled: int, needed: int, ids: list[int],
               scratch: int) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """A fork's block table (NOTE [Forks]) from its parent's, and the pages to copy.

    Args:
        block_table: the parent's ``(B, n_pages)`` table.
        page_size: rows per page.
        filled, needed: the fork shares positions ``0 .. filled-1`` and writes ``filled ..
            needed-1`` (``0 <= filled <= needed <= n_pages * page_size``).
        ids: the fork's own pages, ``own`` a sequence (``fork_pages``), sequence by sequence.
        scratch: the page every other entry past them addresses.

    Returns:
        The fork's ``(B, n_pages)`` table (the logical pages below ``first`` the parent's, then
        ``ids``, then ``scratch``) and ``[(src, dst), ...]``: for each sequence, the parent's page
        holding ``filled`` and the fork's copy of it (none when ``filled`` is a page boundary).
    """
    B, n_pages = block_table.shape
    first, own = fork_pages(filled, needed, page_size)
    table = block_table.clone()  # (B, n_pages)
    mine = torch.tensor(ids, dtype=table.dtype).view(B, own).to(table.device)  # (B, own)
    table[:, first:first + own] = mine
    table[:, first + own:] = scratch
    copies = list(zip(block_table[:, first].tolist(), mine[:, 0].tolist())) if filled % page_size else []
    return table, copies


class PagedKVCache(SeparateWrites):  # update_qkv: the separate ops, then update
    """Keys and values of ``n_layers`` layers in pages of ``page_size`` positions.

    Args:
        n_layers, batch, n_kv_heads, max_len, head_dim: as ``KVCache``'s; the block table addresses
            ``ceil(max_len / page_size)`` pages a sequence.
        page_size: positions a page holds (1 .. max_len).
        generator: orders the pool's pages among the sequences (default: seeded with 0).
        dtype, device, checked: as ``KVCache``'s.

    The pool holds the ``batch * ceil(max_len / page_size)`` pages the block table addresses, one
    spare page a sequence and a scratch page (NOTE [Forks]); ``nbytes`` counts the addressed ones.

    Raises:
        ValueError: for a size (``n_layers``, ``batch``, ``n_kv_heads``, ``max_len``, ``head_dim``,
            ``page_size``) that is not an integer >= 1, a ``page_size`` above ``max_len``, a pool of
            more than ``2**31 - 1`` pages (the int32 block table's range), or a ``generator`` that is
            not ``None`` or a ``torch.Generator``.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *, page_size: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", checked: bool = True,
                 generator: torch.Generator | None = None) -> None:
        for name, value in (("n_layers", n_layers), ("batch", batch), ("n_kv_heads", n_kv_heads), ("max_len", max_len),
                            ("head_dim", head_dim), ("page_size", page_size)):
            check_int(name, value, 1)
        if page_size > max_len:  # one page would hold them all: the rest of it is memory no position uses
            raise ValueError(f"page_size must be at most max_len {max_len}, got {page_size}")
        if generator is not None and not isinstance(generator, torch.Generator):  # on any device: it draws there
            raise ValueError(f"generator must be None or a torch.Generator, got {type(generator).__name__}")
        self.checked, self.max_len, self.page_size = checked, max_len, page_size
        pages = -(-max_len // page_size)  # a sequence's pages
        shape = (n_layers, batch * pages + batch + 1, page_size, n_kv_heads, head_dim)  # spares: NOTE [Forks]
        if shape[1] > 2**31 - 1:  # the block table is int32: a page id past it would wrap into another's
            raise ValueError(f"a pool of {shape[1]} pages exceeds the int32 block table")
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (n_layers, num_pages, page_size, Hkv, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        generator = generator or torch.Generator().manual_seed(0)
        order = torch.randperm(shape[1], generator=generator, device=generator.device)  # where it draws, by name
        self.block_table = order[:batch * pages].view(batch, pages).to(device=device, dtype=torch.int32)  # (B, pages)
        self._order = order.tolist()  # the pool's pages in their random order: a fork's free pages keep it
        self._writable = (0, max_len)  # positions a write may touch: a fork's own (NOTE [Forks])
        self._free: _FreePages | None = None  # set when forked: this cache is then read-only
        self._addressed = batch * pages  # distinct pages the block table addresses

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values of the pages the block table addresses (a fork's shared pages
        included, ``shared_nbytes`` says how many; the scratch page aside). A forked cache counts
        only its pages below the frozen positions: the pages past them are its forks'."""
        return self._addressed * (self.k[0, 0].nbytes + self.v[0, 0].nbytes) * self.k.shape[0]

    @property
    def shared_nbytes(self) -> int:
        """Bytes of ``nbytes`` in pages shared with the cache this one was forked from (0 if none)."""
        return self._shared * (self.k[0, 0].nbytes + self.v[0, 0].nbytes) * self.k.shape[0]

    _shared, _is_fork = 0, False  # a fork's (NOTE [Forks])

    def copy(self, checked: bool | None = None) -> PagedKVCache:
        """A new cache holding copies of the whole pool (the block table shared: never written). A
        fork's copy shares nothing with the fork's parent and is no fork, but writes only the fork's
        positions (its entries past them address one scratch page)."""
        new = PagedKVCache.__new__(PagedKVCache)
        new.__dict__.update(self.__dict__)
        new.checked = self.checked if checked is None else checked
        new.k, new.v = self.k.clone(), self.v.clone()
        new._free, new._shared, new._is_fork = None, 0, False
        if self._free is not None:  # a frozen cache's copy addresses its whole table again
            new._addressed = self.block_table.numel()
        return new

    def fork(self, filled: int, needed: int, checked: bool | None = None) -> PagedKVCache:
        """A cache sharing this one's positions ``0 .. filled-1`` and writing ``filled .. needed-1``
        in pages of its own (NOTE [Forks]); this cache is read-only from the first fork on.

        Raises:
            ValueError: for ``filled`` or ``needed`` not ints with ``0 <= filled <= needed <=
                max_len``, a fork of a fork, a ``filled`` other than the first fork's, or too few
                free pages (forks alive at once share them).
        """
        for name, value in (("filled", filled), ("needed", needed)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if not 0 <= filled <= needed <= self.max_len:
            raise ValueError(f"fork needs 0 <= filled <= needed <= max_len {self.max_len}, got {filled}, {needed}")
        if self._is_fork:
            raise ValueError("fork the cache this fork was forked from, not the fork")
        ps, B = self.page_size, self.block_table.shape[0]
        if self._free is None:  # freeze: every page not addressed below `filled` is free
            kept = set(self.block_table[:, :-(-filled // ps)].flatten().tolist())
            free = [p for p in self._order if p not in kept]
            self._free, self._frozen = _FreePages(free[:-1], free[-1]), filled  # the last: the scratch page
            self._addressed = B * -(-filled // ps)  # the pages past `filled` are the forks' now
        elif filled != self._frozen:
            raise ValueError(f"this cache was frozen at {self._frozen} positions by its first fork; got {filled}")
        first, own = fork_pages(filled, needed, ps)
        ids = self._free.take(B * own)
        table, copies = fork_table(self.block_table, ps, filled, needed, ids, self._free.scratch)  # (B, pages)
        if copies:  # copy on write: the page holding `filled` keeps this cache's rows below it
            src, dst = torch.tensor(copies, device=self.k.device).T  # (B,), (B,)
            self.k[:, dst], self.v[:, dst] = self.k[:, src], self.v[:, src]
        new = PagedKVCache.__new__(PagedKVCache)
        new.__dict__.update(self.__dict__)
        new.checked = self.checked if checked is None else checked
        new.block_table, new._writable, new._free = table, (filled, needed), None
        new._shared, new._addressed, new._is_fork = B * first, B * (first + own), True
        weakref.finalize(new, self._free.give, ids)
        return new

    def update(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str = "torch") -> None:
        """Write ``k, v`` ``(B, Hkv, L, D)`` at positions ``pos`` ``(L,)`` or ``(B, L)`` (each row's own),
        by indexed assignment for every ``impl`` (``KVCache.update``'s signature; the one-kernel write
        is for contiguous caches: wmtp/fused.py).

        Raises:
            ValueError: as ``KVCache.update``.
        """
        if self._free is not None:
            raise ValueError("this cache has been forked (NOTE [Forks] in wmtp/pagedcache.py): it is read-only")
        n_layers, _, _, Hkv, D = self.k.shape
        check_write(layer, pos, k, v, (n_layers, self.block_table.shape[0], Hkv, D),
                    self._writable if self.checked else None)
        check_impl(impl)
        page, row = page_rows(self.block_table, self.page_size, pos)  # (B, L), (L,) or (B, L)
        self.k[layer][page, row] = k.transpose(1, 2).to(self.k.dtype)  # (B, L, Hkv, D) into (B, L) rows
        self.v[layer][page, row] = v.transpose(1, 2).to(self.v.dtype)

    def read(self, layer: int, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(B, Hkv, L, D)`` at positions ``pos`` ``(L,)`` or ``(B, L)`` (a gathered copy).

        Raises:
            ValueError: as ``KVCache.read``.

        Positions are not range-checked (that would read the device, every step): one outside ``[0,
        max_len)`` reads whatever page row the block table's indexing gives it (torch's ``IndexError``
        past the table, on CUDA a device-side assert; no error within the last page).
        """
        check_read(pos, self.block_table.shape[0])
        page, row = page_rows(self.block_table, self.page_size, pos)  # (B, L), (L,) or (B, L)
        return self.k[layer][page, row].transpose(1, 2), self.v[layer][page, row].transpose(1, 2)

    def attend(self, layer: int, q: torch.Tensor, pos: torch.Tensor, n_sink: int | None, window: int | None,
               impl: str, q_sink: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of queries ``q`` ``(B, Hq, Lq, D)`` at ``pos`` over the key set ``(n_sink, window)``,
        read in place through the block table (``paged_attention``)."""
        return paged_attention(q, self.k[layer], self.v[layer], self.block_table, pos, n_sink, window, impl,
                               q_sink=q_sink)


class _FreePages:
    """A pool's pages no cache addresses (NOTE [Forks]): ``take`` some, ``give`` them back; ``scratch``
    is the page every fork's table addresses past its last written position."""

    def __init__(self, ids: list[int], scratch: int) -> None:
        self.ids, self.scratch = ids, scratch

    def take(self, n: int) -> list[int]:
        if n > len(self.ids):
            gc.collect()  # a finished run's fork in a reference cycle still holds its pages
        if n > len(self.ids):
            raise ValueError(f"a fork needs {n} free pages and the pool has {len(self.ids)}: forks alive at once "
                             "share the pages past the frozen positions (give a larger max_len, or let one go)")
        taken = self.ids[:n]
        del self.ids[:n]  # in place: a finalizer's `give` may run at any allocation
        return taken

    def give(self, ids: list[int]) -> None:
        self.ids.extend(ids)
