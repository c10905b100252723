"""The draft's ring cache (wmtp/ringcache.py) beyond tests/test_ringcache.py: ``fill_from`` with a batch of
sequences fills each one's own slots, as writing its positions one by one does; ``checked=False`` skips the
range check; a key set past int64's limits is refused when the ring is built, and a bad one by ``check_reads``
before a call writes."""

import pytest
import torch

from wmtp.kvcache import KVCache
from wmtp.ringcache import RingKVCache


def test_fill_from_fills_each_sequences_own_slots():
    g = torch.Generator().manual_seed(4)
    full = KVCache(1, 2, 2, 20, 4, dtype=torch.float64)
    full.update(0, torch.arange(20), *torch.randn(2, 2, 2, 20, 4, generator=g, dtype=torch.float64))
    filled, written = (RingKVCache(1, 2, 2, 4, n_sink=2, window=3, spare=1, max_len=20, dtype=torch.float64)
                       for _ in range(2))
    filled.fill_from(full, 13)  # the sinks 0, 1 and positions 9 .. 12, in slots 0, 1 and 5, 2, 3, 4 of each row
    for p in range(13):
        written.update(0, torch.tensor([p]), full.k[0][:, :, p:p + 1], full.v[0][:, :, p:p + 1])
    assert torch.equal(filled.k, written.k) and torch.equal(filled.v, written.v)
    row1 = filled.block_table[1, [0, 1, 9, 10, 11, 12]].long()  # the second sequence's slots: 6 + (0, 1, 5, 2, 3, 4)
    assert row1.tolist() == [6, 7, 11, 8, 9, 10]
    assert torch.equal(filled.k[0][row1, 0], full.k[0][1, :, [0, 1, 9, 10, 11, 12]].transpose(0, 1))


def test_an_unchecked_ring_reads_no_positions(monkeypatch):
    def no_read(*args, **kwargs):
        raise AssertionError("the range check read the positions")

    rings = [RingKVCache(1, 1, 2, 4, n_sink=1, window=2, spare=1, max_len=8, checked=c) for c in (False, True)]
    monkeypatch.setattr(torch, "aminmax", no_read)
    rings[0].update(0, torch.tensor([5]), torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert rings[0].k.sum() == 2 * 4
    with pytest.raises(AssertionError, match="range check"):
        rings[1].update(0, torch.tensor([5]), torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))


@pytest.mark.parametrize("n_sink, window, name", [(2**63, 2, "n_sink"), (2, 2**64, "window")])
def test_a_key_set_past_the_limit_is_refused_when_the_ring_is_built(n_sink, window, name):
    """n_sink 2**63 was a ring of max_len slots, every position a sink; a window of 2**64 an OverflowError."""
    with pytest.raises(ValueError, match=rf"{name} must be at most 2\*\*62"):
        RingKVCache(1, 1, 2, 4, n_sink=n_sink, window=window, spare=1, max_len=8)


@pytest.mark.parametrize("n_sink, window, name", [(-1, 2, "n_sink"), (1, 1.5, "window"), (1, 0, "window")])
def test_check_reads_refuses_a_bad_key_set(n_sink, window, name):
    """Refused before the call writes (``Attention.forward``), not only when it reads: -1 sinks, a window of
    1.5 or 0 passed the ring's "needs more" comparison."""
    ring = RingKVCache(1, 1, 2, 4, n_sink=2, window=6, spare=3, max_len=20)
    with pytest.raises(ValueError, match=name):
        ring.check_reads(1, n_sink, window)


def test_a_copy_owns_its_values_and_takes_its_own_checked(monkeypatch):
    """``copy`` (mutation round 15): the copy's values are its own, as its keys are (a write to the copy
    leaves the original's ``v`` alone); ``checked`` is the original's unless given, and a given one is
    the copy's (``prefill``'s ``cache.copy(checked)``)."""
    def no_read(*args, **kwargs):
        raise AssertionError("the range check read the positions")

    ring = RingKVCache(1, 1, 2, 4, n_sink=1, window=2, spare=1, max_len=8)
    copy = ring.copy()
    copy.update(0, torch.tensor([3]), torch.ones(1, 2, 1, 4), torch.full((1, 2, 1, 4), 2.0))
    assert ring.k.sum() == 0 and ring.v.sum() == 0 and copy.v.sum() == 2 * 2 * 4
    assert copy.checked is True
    assert ring.copy(checked=False).checked is False
    assert RingKVCache(1, 1, 2, 4, n_sink=1, window=2, spare=1, max_len=8, checked=False).copy().checked is False
    monkeypatch.setattr(torch, "aminmax", no_read)
    ring.copy(checked=False).update(0, torch.tensor([5]), torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))


def test_a_write_of_another_dtype_is_cast_to_the_rings():
    """``update`` (mutation round 15) casts float32 keys and values into a float64 ring alike; an indexed
    assignment of another dtype raises."""
    ring = RingKVCache(1, 1, 1, 2, n_sink=0, window=2, spare=1, max_len=8, dtype=torch.float64)
    k = torch.tensor([[[[0.5, 1.5]]]])  # (B, Hkv, L, D) float32
    ring.update(0, torch.tensor([4]), k, -k)
    assert ring.k[0, 1, 0, 0].tolist() == [0.5, 1.5] and ring.v[0, 1, 0, 0].tolist() == [-0.5, -1.5]


def test_a_ring_of_more_rows_than_an_int32_block_table_addresses_is_refused():
    """batch * slots rows past 2**31 - 1 would wrap to negative ids (another row's slots) when stored
    as int32: refused before anything is allocated (2**20 rows of 2**11 slots: 2**31)."""
    with pytest.raises(ValueError, match=r"^batch \* slots = 1048576 \* 2048 ring rows exceed the int32 block table$"):
        RingKVCache(1, 2**20, 1, 1, n_sink=0, window=2**11, spare=0, max_len=2**12)
