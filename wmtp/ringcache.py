"""The draft's compact KV cache: a ring buffer of ``n_sink + window + spare`` slots a layer
(``max_len`` if fewer), whatever the context (beyond arXiv 2607.21535, Sec. 3, which keeps the
draft's full KV and only reads the key set: a windowed draft never reads the rest, so it need not
keep it).

Position ``p`` lives in slot ``ring_slot(p, n_sink, window, spare)`` (wmtp/kvcache.py: the sinks
pinned, the rest rotating). The slots are pages of one row of a paged cache, and a block table of
``max_len`` entries maps each position to its slot, so the paged attention op reads the key set
in place (the Triton kernel) or gathers only the key set's ranges (the reference, through
``PagedView``, wmtp/attention/paged.py): a draft query never sees the ring's layout.

NOTE [Ring writes]: ``ring_slot``'s no-evicted-read argument holds when at most ``spare``
positions past a query have been written before it reads. A call's queries read after the call
has written their positions, so a call takes at most ``spare + 1`` queries (a speculative step's
extend: ``depth + 1``, with ``spare = depth``); ``check_reads`` refuses more before the call
writes. A write alone reads nothing, so ``update`` only needs one position a slot: it takes at
most ``slots`` positions a call, which must fall in distinct slots (consecutive ones do, up to
``window + spare`` of them past the sinks, and so do ``ring_kept``'s), and the prompt's prefill
writes the positions the ring keeps in one call a span (wmtp/prefill.py). Queries read only
through ``attend``, whose key set must fit the ring: a window of at most ``window`` keys, no more
than ``n_sink`` sinks (``window=None``, the native draft's full set, cannot).
"""

from __future__ import annotations

import torch

from .attention import paged_attention
from .checks import check_int
from .keyset import check_key_set_args
from .kvcache import SeparateWrites, check_impl, check_write, ring_slot

__all__ = ["RingKVCache", "ring_kept"]


def ring_kept(length: int, n_sink: int | None, window: int, spare: int) -> tuple[range, range]:
    """The positions writing ``0 .. length-1`` one by one leaves in a ring of ``(n_sink, window, spare)``:
    the sinks and the last ``window + spare`` (each slot's last write; a prefill writes only these)."""
    sinks = min(n_sink or 0, length)
    return range(sinks), range(max(sinks, length - window - spare), length)


class RingKVCache(SeparateWrites):  # update_qkv: the separate ops, then update
    """Keys and values of ``n_layers`` draft layers in ``n_sink + window + spare`` slots each.

    The same interface as ``KVCache`` (wmtp/kvcache.py): ``update`` writes positions, ``attend``
    runs attention over them, ``copy``; ``nbytes`` is what it holds.

    Raises:
        ValueError: for a key set a ring cannot hold (``window=None``), a ``spare`` that is not an integer
            >= 0, a size (``n_layers``, ``batch``, ``n_kv_heads``, ``head_dim``, ``max_len``) that is
            not an integer >= 1, or more than ``2**31 - 1`` ring rows (``batch * slots``: the int32
            block table's range).
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, head_dim: int, *, n_sink: int | None,
                 window: int | None, spare: int, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", checked: bool = True) -> None:
        check_key_set_args(n_sink, window)
        if window is None:
            raise ValueError("a ring cache holds a window of keys; window=None (every key) needs a KVCache")
        for name, value, low in (("spare", spare, 0), ("n_layers", n_layers, 1), ("batch", batch, 1),
                                 ("n_kv_heads", n_kv_heads, 1), ("head_dim", head_dim, 1), ("max_len", max_len, 1)):
            check_int(name, value, low)
        self.n_sink, self.window, self.spare, self.checked = n_sink or 0, window, spare, checked
        # no more slots than positions: below n_sink + window + spare, ring_slot(p) is p (nothing wraps)
        self.slots = min(self.n_sink + window + spare, max_len)
        if batch * self.slots > 2**31 - 1:  # the block table is int32: a row past it would wrap into another's
            raise ValueError(f"batch * slots = {batch} * {self.slots} ring rows exceed the int32 block table")
        shape = (n_layers, batch * self.slots, 1, n_kv_heads, head_dim)  # pages of one row
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (n_layers, B * slots, 1, Hkv, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        slot = ring_slot(torch.arange(max_len, device=device), self.n_sink, window, spare)  # (max_len,)
        rows = torch.arange(batch, device=device)[:, None] * self.slots + slot[None]  # (B, max_len)
        self.block_table = rows.to(torch.int32)

    @property
    def max_len(self) -> int:
        return self.block_table.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held (the block table aside)."""
        return self.k.nbytes + self.v.nbytes

    def copy(self, checked: bool | None = None) -> RingKVCache:
        """A new ring holding copies of these keys and values (the block table shared: never written)."""
        new = RingKVCache.__new__(RingKVCache)
        new.__dict__.update(self.__dict__)
        new.checked = self.checked if checked is None else checked
        new.k, new.v = self.k.clone(), self.v.clone()
        return new

    def kept(self, length: int) -> tuple[range, range]:
        """``ring_kept`` of this ring's key set and spare slots."""
        return ring_kept(length, self.n_sink, self.window, self.spare)

    def fill_from(self, cache, length: int) -> None:
        """Hold what writing positions ``0 .. length-1`` of ``cache`` (a ``KVCache`` or ``PagedKVCache`` of
        the same layers and heads) one by one would leave (``kept``)."""
        keep = torch.tensor([p for span in self.kept(length) for p in span], dtype=torch.long,
                            device=self.k.device)  # (kept,)
        if keep.numel():
            rows = self.block_table[:, keep].long().flatten()  # (B * kept,) batch-major
            Hkv, D = self.k.shape[-2:]
            for layer in range(self.k.shape[0]):  # (B, Hkv, kept, D) -> (B * kept, Hkv, D)
                k, v = cache.read(layer, keep)
                self.k[layer][rows, 0] = k.transpose(1, 2).reshape(-1, Hkv, D)
                self.v[layer][rows, 0] = v.transpose(1, 2).reshape(-1, Hkv, D)

    def update(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str = "torch") -> None:
        """Write ``k, v`` ``(B, Hkv, L, D)`` at positions ``pos`` ``(L,)`` or ``(B, L)`` (each row's own),
        each into its slot, by indexed assignment for every ``impl`` (``KVCache.update``'s signature;
        the one-kernel write is for contiguous caches: wmtp/fused.py).

        Raises:
            ValueError: for a layer outside the cache, positions that are not a non-empty ``(L,)`` or
                ``(B, L)`` integer tensor, more of them a row than the ring has slots (NOTE [Ring writes]:
                positions of one call must fall in distinct slots; only their count is checked), or
                (when ``checked``) positions outside ``[0, max_len)``; ``k, v`` of another shape.
        """
        n_layers, _, _, Hkv, D = self.k.shape
        check_write(layer, pos, k, v, (n_layers, self.block_table.shape[0], Hkv, D),
                    self.max_len if self.checked else None)
        check_impl(impl)
        if pos.shape[-1] > self.slots:
            raise ValueError(f"a ring of {self.slots} slots takes at most {self.slots} positions a write, "
                             f"got {pos.shape[-1]} (NOTE [Ring writes] in wmtp/ringcache.py)")
        pos = pos.long().to(self.block_table.device)
        table = self.block_table.gather(1, pos) if pos.dim() == 2 else self.block_table[:, pos]  # (B, L)
        rows = table.long().flatten()  # (B * L,) slot rows, batch-major
        self.k[layer][rows, 0] = k.transpose(1, 2).reshape(-1, Hkv, D).to(self.k.dtype)  # (B*L, Hkv, D)
        self.v[layer][rows, 0] = v.transpose(1, 2).reshape(-1, Hkv, D).to(self.v.dtype)

    def check_reads(self, q_len: int, n_sink: int | None, window: int | None) -> None:
        """Refuse a call of ``q_len`` queries over the key set ``(n_sink, window)`` that this ring cannot
        serve, before the call writes (``Attention.forward``; ``attend`` checks again).

        Raises:
            ValueError: for a key set the ring does not hold (more sinks, a longer window, or none), or
                more than ``spare + 1`` queries (NOTE [Ring writes]: the call wrote theirs before they read).
        """
        check_key_set_args(n_sink, window)
        if q_len > self.spare + 1:
            raise ValueError(f"a ring of {self.spare} spare slots takes at most {self.spare + 1} queries a call, "
                             f"got {q_len} (NOTE [Ring writes] in wmtp/ringcache.py)")
        if window is None or window > self.window or (n_sink or 0) > self.n_sink:
            raise ValueError(f"this ring holds {self.n_sink} sinks and a window of {self.window} keys; "
                             f"the key set ({n_sink}, {window}) needs more")

    def attend(self, layer: int, q: torch.Tensor, pos: torch.Tensor, n_sink: int | None, window: int | None,
               impl: str, q_sink: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of queries ``q`` ``(B, Hq, Lq, D)`` at ``pos`` over the key set ``(n_sink, window)``
        (``q_sink``: the queries that score the sinks, re-indexed positions).

        Raises:
            ValueError: as ``check_reads``.
        """
        self.check_reads(q.shape[2], n_sink, window)
        kp, vp = self.k[layer], self.v[layer]  # (B * slots, 1, Hkv, D): pages of one row
        return paged_attention(q, kp, vp, self.block_table, pos, n_sink, window, impl, q_sink=q_sink)
