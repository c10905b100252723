"""What every KV cache shares (wmtp/kvcache.py): copies own their buffers and take their own ``checked``
(a contiguous cache's, a ring's, a paged cache's and its forks'), a row view shares its row and keeps the
cache's, writes are cast to the cache's dtype, and the shared checks refuse what they must (sizes, empty
writes, positions that are no tensor, values of another shape, a write's impl, a paged cache's generator,
ring slots of negative positions). (Writes, reads and their checks: tests/test_model.py and
tests/test_row_positions.py; ``ring_slot``'s formula: tests/test_grading_harness.py.)"""

import pytest
import torch

from wmtp.kvcache import KVCache, ring_slot
from wmtp.pagedcache import PagedKVCache
from wmtp.ringcache import RingKVCache


def _no_read(*args, **kwargs):
    raise AssertionError("the range check read the positions")


def test_a_copy_owns_its_buffers_and_takes_its_own_checked(monkeypatch):
    g = torch.Generator().manual_seed(0)
    cache = KVCache(1, 1, 2, 8, 4, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, 3, 4, generator=g, dtype=torch.float64)  # (B, Hkv, L, D) each
    cache.update(0, torch.tensor([0, 1, 2]), k, v)
    twin = cache.copy()
    assert twin.checked and torch.equal(twin.k, cache.k) and torch.equal(twin.v, cache.v)
    twin.update(0, torch.tensor([1]), torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))  # the copy's write...
    assert torch.equal(cache.read(0, torch.tensor([1]))[0], k[:, :, 1:2])  # ...leaves the original's keys
    assert torch.equal(cache.read(0, torch.tensor([1]))[1], v[:, :, 1:2])  # and values as they were
    with pytest.raises(ValueError, match="do not fit"):  # checked=True: an unchecked cache's checked copy
        KVCache(1, 1, 2, 8, 4, checked=False).copy(checked=True).update(0, torch.tensor([8]), k[:, :, :1], v[:, :, :1])
    unchecked = cache.copy(checked=False)
    monkeypatch.setattr(torch, "aminmax", _no_read)
    unchecked.update(0, torch.tensor([5]), k[:, :, :1], v[:, :, :1])  # no read of the positions
    assert torch.equal(unchecked.k[0, :, :, 5], k[:, :, 0]) and not cache.k[0, :, :, 5].any()
    with pytest.raises(AssertionError, match="range check"):
        cache.update(0, torch.tensor([5]), k[:, :, :1], v[:, :, :1])


def test_a_row_view_writes_its_row_and_keeps_the_caches_checked(monkeypatch):
    cache = KVCache(2, 3, 2, 8, 4, checked=False)
    row = cache.row(1)
    assert row.k.shape == (2, 1, 2, 8, 4) and row.max_len == 8
    monkeypatch.setattr(torch, "aminmax", _no_read)  # an unchecked cache's row reads no positions either
    row.update(1, torch.tensor([6, 2]), torch.ones(1, 2, 2, 4), 2 * torch.ones(1, 2, 2, 4))
    assert cache.k[1, 1, :, [2, 6]].eq(1).all() and cache.v[1, 1, :, [2, 6]].eq(2).all()  # row 1 of the cache
    assert cache.k.sum() == 2 * 2 * 4 and cache.v.sum() == 2 * 2 * 2 * 4  # and nothing else
    monkeypatch.undo()
    checked = KVCache(2, 3, 2, 8, 4).row(1)  # a checked cache's row checks too (an unchecked row survived)
    with pytest.raises(ValueError, match="do not fit"):
        checked.update(1, torch.tensor([-1]), torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))


@pytest.mark.parametrize("checked", [True, False])
def test_an_empty_write_is_refused_whether_checked_or_not(checked):
    """No integer positions: a ValueError (a RuntimeError from the range check's aminmax, or a silent
    no-op unchecked, before), as an empty float tensor of positions is."""
    cache = KVCache(1, 1, 2, 8, 4, checked=checked)
    with pytest.raises(ValueError, match="non-empty"):
        cache.update(0, torch.tensor([], dtype=torch.long), torch.zeros(1, 2, 0, 4), torch.zeros(1, 2, 0, 4))


def test_values_of_another_shape_are_refused_not_broadcast():
    """Keys ``(B, Hkv, L, D)`` with values of one position: a ValueError, not the one value written at every
    position (indexed assignment broadcasts it)."""
    cache = KVCache(1, 1, 2, 8, 4)
    with pytest.raises(ValueError, match=r"k, v must be \(1, 2, 3, 4\)"):
        cache.update(0, torch.tensor([0, 1, 2]), torch.ones(1, 2, 3, 4), torch.ones(1, 2, 1, 4))
    assert not cache.v.any()


@pytest.mark.parametrize("name, sizes", [("n_layers", (0, 1, 8)), ("batch", (1, 0, 8)), ("max_len", (1, 1, 0))])
def test_a_cache_of_no_layers_rows_or_positions_is_refused(name, sizes):
    n_layers, batch, max_len = sizes
    with pytest.raises(ValueError, match=f"{name} must be an integer >= 1, got 0"):
        KVCache(n_layers, batch, 2, max_len, 4)


SIZES = ("n_layers", "batch", "n_kv_heads", "max_len", "head_dim")


def _cache(kind: str, **sizes):
    """A cache of one kind with sizes ``(1, 1, 2, 8, 4)`` but the given ones."""
    a = dict(zip(SIZES, (1, 1, 2, 8, 4))) | sizes
    if kind == "ring":
        return RingKVCache(a["n_layers"], a["batch"], a["n_kv_heads"], a["head_dim"], n_sink=1, window=2, spare=1,
                           max_len=a["max_len"])
    return KVCache(*a.values()) if kind == "contiguous" else PagedKVCache(*a.values(), page_size=4)


@pytest.mark.parametrize("kind", ["contiguous", "paged", "ring"])
@pytest.mark.parametrize("name", SIZES)
@pytest.mark.parametrize("value", [0, -2, 2.0])
def test_every_size_below_1_is_refused_by_name(kind, name, value):
    """No heads or a zero head_dim built a cache of 0 bytes; a negative one was torch.zeros' RuntimeError."""
    with pytest.raises(ValueError, match=f"{name} must be an integer >= 1, got {value}"):
        _cache(kind, **{name: value})


def test_a_paged_cache_refuses_a_generator_that_is_not_one():
    with pytest.raises(ValueError, match="generator must be None or a torch.Generator, got int"):
        PagedKVCache(1, 1, 2, 8, 4, page_size=4, generator=1)  # AttributeError ('int' ... 'device') before


@pytest.mark.parametrize("kind", ["contiguous", "paged", "ring"])
def test_positions_that_are_not_a_tensor_are_value_errors(kind):
    """A list of positions was an AttributeError ('list' object has no attribute 'dim'), in writes and reads."""
    cache, kv = _cache(kind), torch.ones(1, 2, 2, 4)
    with pytest.raises(ValueError, match="pos must be a torch.Tensor, got list"):
        cache.update(0, [0, 1], kv, kv)
    with pytest.raises(ValueError, match="pos must be a torch.Tensor, got list"):  # rotated first: refused before
        cache.update_qkv(0, [0, 1], kv, kv, kv, torch.ones(2), None)
    if kind != "ring":  # a ring has no read (its queries read through attend)
        with pytest.raises(ValueError, match="pos must be a torch.Tensor, got list"):
            cache.read(0, [1])
    assert not cache.k.any()


@pytest.mark.parametrize("kind", ["contiguous", "paged", "ring"])
@pytest.mark.parametrize("name", ["k", "v"])
def test_keys_or_values_that_are_not_a_tensor_are_value_errors(kind, name):
    """check_write names a k or v that is no tensor (a list, a NumPy array) before it reads a shape from it."""
    import numpy as np

    cache, kv, pos = _cache(kind), torch.ones(1, 2, 2, 4), torch.tensor([0, 1])
    for bad, got in (([[0.0]], "list"), (np.ones((1, 2, 2, 4)), "ndarray")):
        with pytest.raises(ValueError, match=f"^{name} must be a torch.Tensor, got {got}$"):
            cache.update(0, pos, **{"k": kv, "v": kv} | {name: bad})
    assert not cache.k.any() and not cache.v.any()


def test_the_ring_and_paged_caches_refuse_an_unknown_write_impl():
    """They write by indexed assignment for every impl, but an impl wmtp.attention does not know is an error."""
    caches = [RingKVCache(1, 1, 2, 4, n_sink=1, window=2, spare=1, max_len=8), PagedKVCache(1, 1, 2, 8, 4, page_size=4)]
    for cache in caches:
        with pytest.raises(ValueError, match="unknown impl 'bogus'"):
            cache.update(0, torch.tensor([3]), torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4), impl="bogus")
        assert not cache.k.any()


def test_ring_slot_of_a_tensor_is_the_ints_and_refuses_negative_positions():
    assert ring_slot(torch.arange(12), 2, 3, 1).tolist() == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 2, 3]
    for bad in (torch.tensor([3, -1]), torch.tensor([2.0])):  # -1 would land in slot 5, a float in a float "slot"
        with pytest.raises(ValueError, match="p must hold integer positions >= 0"):
            ring_slot(bad, 2, 3, 1)


def test_the_ring_and_paged_caches_cast_a_write_to_their_dtype():
    """float32 keys and float16 values into float64 caches (as KVCache.update casts them: tests/test_model.py):
    each position's row holds the written values in the cache's dtype."""
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(2, 1, 2, 3, 4, generator=g)  # (B, Hkv, L, D) float32 each
    pos = torch.tensor([5, 0, 6])
    ring = RingKVCache(1, 1, 2, 4, n_sink=1, window=2, spare=1, max_len=8, dtype=torch.float64)
    paged = PagedKVCache(1, 1, 2, 8, 4, page_size=4, dtype=torch.float64)
    for cache in (ring, paged):
        cache.update(0, pos, k, v.half())
    slots = ring.block_table[0, pos].long()  # (L,): positions 5, 0, 6 in slots 2, 0, 3 of 4
    assert slots.tolist() == [2, 0, 3]
    assert torch.equal(ring.k[0][slots, 0], k[0].transpose(0, 1).double())  # (L, Hkv, D)
    assert torch.equal(ring.v[0][slots, 0], v[0].transpose(0, 1).half().double())
    got_k, got_v = paged.read(0, pos)  # (B, Hkv, L, D) each
    assert got_k.dtype == torch.float64 and torch.equal(got_k, k.double()) and torch.equal(got_v, v.half().double())


def test_ring_and_paged_copies_and_forks_take_their_own_checked(monkeypatch):
    """``copy(checked=False)`` (and a paged cache's ``fork(..., checked=False)``) skips the range check, the
    one read of the positions, whatever the original's; ``copy()`` keeps the original's."""
    one = (torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    ring = RingKVCache(1, 1, 2, 4, n_sink=1, window=2, spare=1, max_len=8)
    paged = PagedKVCache(1, 1, 2, 8, 4, page_size=4)
    unchecked = [ring.copy(checked=False), paged.copy(checked=False), paged.fork(4, 8, checked=False)]
    checked = [ring.copy(), paged.copy(), paged.fork(4, 8)]
    monkeypatch.setattr(torch, "aminmax", _no_read)
    for cache in unchecked:
        cache.update(0, torch.tensor([5]), *one)
        assert not cache.checked
    for cache in checked:
        with pytest.raises(AssertionError, match="range check"):
            cache.update(0, torch.tensor([5]), *one)
