"""The host-side key plan: which key blocks a tile of queries reads (arXiv 2607.21535, Sec. 3).

The Triton kernel (attention/triton_attention.py) plans its two key ranges on device from the
positions it loads (NOTE [Host sync] there); ``key_plan`` is the same computation in Python, the
readable reference that tests/test_triton_attention.py checks the device plan against.
"""

from __future__ import annotations

from typing import NamedTuple

from ..keyset import key_ranges

__all__ = ["KeyPlan", "key_plan"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KeyPlan(NamedTuple):
    """The key blocks of a tile of queries at positions ``t_min .. t_max`` (host side)."""

    sink_hi: int  # sink range [0, sink_hi)
    n_blk_sink: int  # its blocks of BLOCK_N keys
    sink_u1: int  # its blocks [sink_u1, sink_u2) are read by every query: no mask
    sink_u2: int
    rec_lo: int  # recent range [rec_lo, rec_hi), disjoint from the sink range
    rec_hi: int
    n_blk_rec: int
    rec_u1: int  # unmasked blocks of the recent range
    rec_u2: int


def _unmasked_blocks(lo: int, hi: int, f_lo: int, f_hi: int, block_n: int) -> tuple[int, int, int]:
    """Blocks of range ``[lo, hi)`` and the interval ``[u1, u2)`` of them inside ``[f_lo, f_hi)``."""
    n_blk = _cdiv(hi - lo, block_n)
    u1 = min(max(0, -((lo - f_lo) // block_n)), n_blk)  # first block starting at or after f_lo
    u2 = min(max(u1, (min(f_hi, hi) - lo) // block_n), n_blk)  # blocks ending at or before f_hi
    return n_blk, u1, u2


def key_plan(t_min: int, t_max: int, n_sink: int | None, window: int | None, block_n: int) -> KeyPlan:
    """Key ranges for queries in ``[t_min, t_max]``: their union, blocked, and the unmasked blocks.

    The host-side reference of the kernel's ``_key_plan``, which runs on device (the launcher never
    calls this: NOTE [Host sync]); tests check the two agree.

    The ranges are the union of the key sets of wmtp/keyset.py; a block is unmasked when all its
    keys lie in the intersection of the key sets of every position in ``[t_min, t_max]``.
    """
    (_, sink_hi), _ = key_ranges(t_max, n_sink, window)  # union: sinks of the last query...
    _, (rec_lo, _) = key_ranges(t_min, n_sink, window)  # ...and the recent range from the first
    rec_lo, rec_hi = max(rec_lo, sink_hi), t_max + 1
    (_, full_sink_hi), _ = key_ranges(t_min, n_sink, window)  # intersection: sinks of the first...
    _, (full_rec_lo, _) = key_ranges(t_max, n_sink, window)  # ...and [recent start of the last, t_min]
    n_blk_sink, sink_u1, sink_u2 = _unmasked_blocks(0, sink_hi, 0, full_sink_hi, block_n)
    n_blk_rec, rec_u1, rec_u2 = _unmasked_blocks(rec_lo, rec_hi, full_rec_lo, t_min + 1, block_n)
    return KeyPlan(sink_hi, n_blk_sink, sink_u1, sink_u2, rec_lo, rec_hi, n_blk_rec, rec_u1, rec_u2)
