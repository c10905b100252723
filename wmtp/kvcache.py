"""Position-indexed KV cache shared by the target LM and the MTP draft head.

The cache is a buffer ``(n_layers, B, Hkv, max_len, D)`` addressed by absolute token position,
as in gpt-fast. NOTE [No rollback]: a forward pass writes the keys of its input positions and
then reads, through the key-set formula, only keys at positions ``<= `` its queries' positions.
Speculative decoding writes draft or verify positions ``p .. p + depth``; positions past the
accepted prefix hold stale keys, but no later query reads a position before it has been written
again by the accepted tokens (queries only read ``j <= t`` and every step rewrites from the first
unaccepted position on). So rejected drafts need no rollback: they are simply overwritten.
(Paper arXiv 2607.21535, Sec. 3: the draft KV and the target KV are separate caches.)

Beside ``KVCache`` this file holds what every cache shares: the checks of a write and a read
(``check_write``, ``check_read``, ``check_impl``), ``SeparateWrites`` (the ring and paged caches'
``update_qkv``), and ``ring_slot``, the slot formula of the draft's ring buffer (wmtp/ringcache.py).
"""

from __future__ import annotations

import torch

from .attention import IMPLS, attention
from .checks import check_int, check_tensors
from .fused import kv_write
from .keyset import is_integer_tensor
from .qkv_write import prepare_qk, qkv_write


class KVCache:
    """Keys and values of ``n_layers`` attention layers, indexed by absolute position.

    ``checked=False`` skips the range check of written positions, the one read of the device in
    ``update``: a step captured in a CUDA graph cannot read the device (wmtp/static_decode.py, whose
    loops derive every position from a capacity checked once, before the first step).

    Raises:
        ValueError: for a size (``n_layers``, ``batch``, ``n_kv_heads``, ``max_len``, ``head_dim``) that
            is not an integer >= 1.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 checked: bool = True) -> None:
        for name, value in (("n_layers", n_layers), ("batch", batch), ("n_kv_heads", n_kv_heads),
                            ("max_len", max_len), ("head_dim", head_dim)):  # as the paged and ring caches'
            check_int(name, value, 1)
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.checked = checked
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (n_layers, B, Hkv, S, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (n_layers, B, Hkv, S, D)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch(self) -> int:
        """Rows (sequences) held."""
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held."""
        return self.k.nbytes + self.v.nbytes

    def copy(self, checked: bool | None = None) -> KVCache:
        """A new cache holding copies of these keys and values (``checked``: this cache's by default)."""
        new = KVCache.__new__(KVCache)
        new.checked = self.checked if checked is None else checked
        new.k, new.v = self.k.clone(), self.v.clone()  # (n_layers, B, Hkv, S, D) each
        return new

    def row(self, b: int) -> KVCache:
        """Row ``b`` as a one-row cache on these buffers: what a pass writes into it, row ``b`` of this
        cache holds (a refilled row's prefill: NOTE [Refill] in wmtp/batched.py).

        Raises:
            ValueError: for a row outside the cache.
        """
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.k.shape[1]:
            raise ValueError(f"row must be an int in [0, {self.k.shape[1]}), got {b!r}")
        view = KVCache.__new__(KVCache)
        view.checked = self.checked
        view.k, view.v = self.k[:, b: b + 1], self.v[:, b: b + 1]  # (n_layers, 1, Hkv, S, D) each, shared
        return view

    def update(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str = "torch"
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` ``(B, Hkv, L, D)`` at positions ``pos`` ``(L,)``, or ``(B, L)``: each row at its
        own (batched decoding with every sequence at its own position); return the layer's buffers.
        ``impl``: the write's, ``kv_write``'s in wmtp/fused.py (``"triton"``: keys and values in one
        kernel; the model passes ``op_impl``'s).

        Raises:
            ValueError: for a layer outside the cache (-1 is not the last one), positions that are not
                a non-empty ``(L,)`` or ``(B, L)`` integer tensor or (when ``checked``) do not fit in the
                cache, ``k, v`` of another shape, or an impl ``kv_write`` refuses.
        """
        n_layers, B, Hkv, _, D = self.k.shape
        check_write(layer, pos, k, v, (n_layers, B, Hkv, D), self.max_len if self.checked else None)
        # The reference is indexed assignment (index_put_), not index_copy_: MPS has no index_copy_
        # before torch 2.8, and its kernel there visits the whole buffer for every write (pytorch/pytorch#185750).
        # any integer dtype (uint8 is no mask here), on the host or the cache's device
        kv_write(self.k[layer], self.v[layer], pos.to(self.k.device, torch.long), k, v, impl)
        return self.k[layer], self.v[layer]  # (B, Hkv, S, D) each

    def update_qkv(self, layer: int, pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   inv_freq: torch.Tensor | None, train_len: int | None, impl: str = "torch") -> torch.Tensor:
        """A layer's queries and keys rotated (``inv_freq``: RoPE's frequencies) or its queries scaled
        (``train_len``: log-length scaling), and ``update`` with the keys, as one op: ``qkv_write``
        (wmtp/qkv_write.py; ``"triton"``: one kernel). Returns the prepared queries ``(B, Hq, L, D)``.

        Raises:
            ValueError: as ``update``, and for arguments ``qkv_write`` refuses.
        """
        n_layers, B, Hkv, _, D = self.k.shape
        check_write(layer, pos, k, v, (n_layers, B, Hkv, D), self.max_len if self.checked else None)
        return qkv_write(q, k, v, pos.to(self.k.device, torch.long), self.k[layer], self.v[layer], inv_freq,
                         train_len, impl)

    def read(self, layer: int, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(B, Hkv, L, D)`` at positions ``pos`` ``(L,)`` or ``(B, L)`` (each row's own).

        Raises:
            ValueError: for positions that are not an ``(L,)`` or ``(B, L)`` integer tensor (``check_read``).

        Positions are not range-checked (that would read the device, every step): one outside ``[0,
        max_len)`` reads what torch's indexing makes of it, an ``IndexError`` past the end (on CUDA a
        device-side assert) and, for a negative one, a position counted from the end.
        """
        check_read(pos, self.k.shape[1])
        if pos.dim() == 2:
            rows = torch.arange(pos.shape[0], device=pos.device)[:, None]  # (B, 1)
            return self.k[layer][rows, :, pos].transpose(1, 2), self.v[layer][rows, :, pos].transpose(1, 2)
        return self.k[layer][:, :, pos], self.v[layer][:, :, pos]

    def check_reads(self, q_len: int, n_sink: int | None, window: int | None) -> None:
        """A call's refusals of its reads, made before it writes (``Attention.forward``): none here,
        every position is held (a ring's: wmtp/ringcache.py)."""

    def attend(self, layer: int, q: torch.Tensor, pos: torch.Tensor, n_sink: int | None, window: int | None,
               impl: str, q_sink: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of queries ``q`` ``(B, Hq, Lq, D)`` at ``pos`` over layer ``layer``'s keys in the
        key set ``(n_sink, window)``: ``wmtp.attention`` on the position-indexed buffers (``q_sink``:
        the queries that score the sinks, re-indexed positions)."""
        return attention(q, self.k[layer], self.v[layer], pos, n_sink=n_sink, window=window, impl=impl, q_sink=q_sink)


class SeparateWrites:
    """``update_qkv`` for caches whose writes stay indexed assignments (the ring and the paged
    caches): the separate ops (``prepare_qk``), then the cache's own ``update``; ``check_reads``
    as ``KVCache``'s (a ring's refuses some)."""

    check_reads = KVCache.check_reads

    @property
    def batch(self) -> int:
        """Rows (sequences) held: the block table's."""
        return self.block_table.shape[0]

    def update_qkv(self, layer: int, pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   inv_freq: torch.Tensor | None, train_len: int | None, impl: str = "torch") -> torch.Tensor:
        """``KVCache.update_qkv``'s signature: returns the prepared queries (``ValueError``: as ``update``)."""
        check_tensors(pos=pos)  # before the rotation reads it; the rest is update's
        q, k = prepare_qk(q, k, pos, inv_freq, train_len, impl)
        self.update(layer, pos, k, v, impl)
        return q


def check_impl(impl: str) -> None:
    """A write's ``impl`` must be one of ``wmtp.attention``'s (the ring and paged caches ignore it)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {', '.join(IMPLS)}")


def check_read(pos: torch.Tensor, batch: int) -> None:
    """A cache read's positions: an integer tensor ``(L,)`` (every row's) or ``(batch, L)`` (each row's own)."""
    check_tensors(pos=pos)
    if pos.dim() not in (1, 2) or not is_integer_tensor(pos) or pos.dim() == 2 and pos.shape[0] != batch:
        raise ValueError(f"read positions must be an integer tensor (L,) or ({batch}, L), got {pos.dtype} "
                         f"{tuple(pos.shape)}")


def check_write(layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: tuple[int, int, int, int],
                max_len: int | tuple[int, int] | None) -> None:
    """A cache write's checks (``KVCache.update``, ``RingKVCache.update``, ``PagedKVCache.update``):
    ``shape`` is the cache's ``(n_layers, B, Hkv, D)``; positions ``(L,)`` (every row's) or ``(B, L)``
    (each row's own) are range-checked against
    ``[0, max_len)``, or ``[a, b)`` for ``max_len=(a, b)`` (a fork's, wmtp/pagedcache.py), unless it
    is ``None`` (one read of the device)."""
    n_layers, B, Hkv, D = shape
    check_tensors(pos=pos, k=k, v=v)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
        raise ValueError(f"layer must be an int in [0, {n_layers}), got {layer!r}")
    if pos.dim() not in (1, 2) or not pos.numel() or not is_integer_tensor(pos) or pos.dim() == 2 and pos.shape[0] != B:
        raise ValueError(f"pos must be a non-empty tensor of integer positions, (L,) or ({B}, L) (each row's own), "
                         f"got {pos.dtype} {tuple(pos.shape)}")
    L = pos.shape[-1]
    if k.shape != (B, Hkv, L, D) or v.shape != k.shape:
        raise ValueError(f"k, v must be {(B, Hkv, L, D)}, got {tuple(k.shape)}, {tuple(v.shape)}")
    if max_len is not None:
        a, b = (0, max_len) if isinstance(max_len, int) else max_len
        lo, hi = torch.stack(torch.aminmax(pos)).tolist()  # one read of the device
        if lo < a or hi >= b:
            where = f"a KV cache of {b} positions" if isinstance(max_len, int) else f"the writable positions [{a}, {b})"
            raise ValueError(f"positions [{lo}, {hi}] do not fit in {where}")


def ring_slot(p: int, n_sink: int, window: int, depth: int) -> int:
    """Slot of absolute position ``p`` in the compact draft-KV ring buffer (docs/concepts.md#the-ring-buffer-slot).

    The ring holds ``n_sink + window + depth`` slots: the sinks are pinned, the rest rotate::

        slot(p) = p                                          if p < n_sink
                  n_sink + (p - n_sink) mod (window + depth)  otherwise

    Reads and writes use this one function. NOTE [No evicted read]: a draft query at position
    ``t`` reads the sinks ``0 .. n_sink-1`` and the recent keys ``t-window+1 .. t`` (wmtp/keyset.py),
    and at most ``depth`` speculative positions ``t+1 .. t+depth`` have been written past it. The
    ``window + depth`` positions ``t-window+1 .. t+depth`` are consecutive, so they fall in distinct
    rotating slots, and no write of a later position has yet reused any of them; the sinks are never
    overwritten. So every key a query reads is still in its slot (tests/test_grading_harness.py simulates it).

    ``p`` may be an int or an integer tensor of positions (the slot of each: wmtp/ringcache.py's
    block table), by the same expression.

    Args:
        p: absolute position(s), an int or an integer tensor, each ``>= 0``.
        n_sink: pinned sink slots (an int ``>= 0``; not ``None`` here).
        window: the draft's window (an int ``>= 1``).
        depth: spare slots for the positions a step writes past a query (an int ``>= 0``).

    Returns:
        The slot(s), in ``[0, n_sink + window + depth)``: an int for an int ``p``, else a tensor of
        ``p``'s shape and dtype.

    Raises:
        ValueError: if ``p < 0``, ``n_sink < 0``, ``window < 1`` or ``depth < 0``.
    """
    checks = (("n_sink", n_sink, 0), ("window", window, 1), ("depth", depth, 0))
    if isinstance(p, torch.Tensor):
        if not is_integer_tensor(p) or (p.numel() and int(p.min()) < 0):
            raise ValueError(f"p must hold integer positions >= 0, got {p.dtype} {tuple(p.shape)}")
    else:
        checks = (("p", p, 0), *checks)
    for name, value, low in checks:
        check_int(name, value, low)
    # p for the sinks, else n_sink + (p - n_sink) mod (window + depth): one expression for ints and tensors
    return p - (p >= n_sink) * ((p - n_sink) - (p - n_sink) % (window + depth))
