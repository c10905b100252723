"""The read-floor kernel of the bench (wmtp/bench_read.py) reads exactly the draft's keys: the
union of the key sets of its queries (wmtp/keyset.py), checked on literal index lists with NaN
everywhere else, and with random positions against the key-set mask. Under the CPU interpreter
without CUDA (tests/conftest.py); its timing is the bench's (``read_floor_ms``), never a test's."""

import os

import pytest
import torch

from wmtp.bench_read import read_key_set
from wmtp.keyset import draft_key_mask

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
pytestmark = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                                reason="Triton needs CUDA or its CPU interpreter (TRITON_INTERPRET=1)")


def _cache(S, Hkv=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, Hkv, S, D, generator=g).to(DEVICE) for _ in range(2))  # (1, Hkv, S, D) each


@pytest.mark.parametrize("block_n", [4, 16])
@pytest.mark.parametrize("S, n_sink, window, positions, keys", [
    (40, 4, 8, [30, 31], [0, 1, 2, 3] + list(range(23, 32))),  # sinks, then the union of two windows
    (40, 0, 8, [39], list(range(32, 40))),  # no sinks
    (40, 4, 8, [5], [0, 1, 2, 3, 4, 5]),  # the window reaches the sinks: no key twice
    (40, 6, 8, [2, 3], [0, 1, 2, 3]),  # queries inside the sinks
    (40, 6, 4, [5, 6, 7], list(range(8))),  # queries across the sink boundary
    (40, 50, 8, [39], list(range(40))),  # more sinks than keys
    (40, 4, 8, [45], [0, 1, 2, 3] + list(range(32, 40))),  # a position past the cache reads as S - 1
])
def test_reads_exactly_the_literal_keys(S, n_sink, window, positions, keys, block_n):
    k, v = _cache(S)
    outside = torch.ones(S, dtype=torch.bool, device=DEVICE)
    outside[keys] = False
    k_nan, v_nan = (x.masked_fill(outside[:, None], float("nan")) for x in (k, v))
    q_pos = torch.tensor(positions, device=DEVICE)
    got = read_key_set(k_nan, v_nan, q_pos, n_sink, window, block_n=block_n).sum()
    want = (k + v)[:, :, keys].sum()
    assert torch.isfinite(got), "a key outside the key set was read"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_a_head_past_2_to_the_31_elements_is_read_where_it_is():
    """NOTE [Offsets]: head 2 of 3 heads of 2^26 x 16 starts 2^31 elements in. The 3 heads are the
    last of 5, int8 (a lazily allocated 5 GiB tensor, of which only the first 64 positions of each
    head are written), so an offset wrapped to 32 bits (-2^31) lands on head 0 of the 5, which holds
    100s: a wrong read fails the test rather than reading outside the allocation (a segfault under
    the interpreter)."""
    g = torch.Generator().manual_seed(2)
    small = torch.randint(-3, 4, (1, 3, 64, 16), generator=g, dtype=torch.int8).to(DEVICE)  # (1, 3, 64, 16)
    five = torch.empty(1, 5, 1 << 26, 16, dtype=torch.int8, device=DEVICE)
    five[:, :2, :64] = 100
    big = five[:, 2:]  # (1, 3, 2^26, 16), 2^31 elements into five
    big[:, :, :64] = small
    got = read_key_set(big, big, torch.tensor([63], device=DEVICE), 4, 8, block_n=16)  # (1, Hkv, n_blk)
    keys = [0, 1, 2, 3] + list(range(56, 64))
    assert torch.equal(got[0].sum(1), 2 * small[0][:, keys].float().sum((1, 2)))  # sums of small integers: exact


def test_int32_positions_past_2_to_the_31_elements_are_read_where_they_are():
    """NOTE [Offsets] for the positions: with int32 positions a key's position is int32 too, and key
    2^28 of one head of 16 starts 2^32 elements in (a lazily allocated int8 tensor of 4 GiB; the sinks
    and the window's 8 keys written, 100s in keys 4..11, where an offset wrapped to 32 bits lands)."""
    S = (1 << 28) + 8
    small = torch.randint(-3, 4, (1, 1, 12, 16), generator=torch.Generator().manual_seed(3), dtype=torch.int8)
    small = small.to(DEVICE)  # (1, 1, 12, 16)
    big = torch.empty(1, 1, S, 16, dtype=torch.int8, device=DEVICE)
    big[:, :, :4], big[:, :, 4:12], big[:, :, S - 8:] = small[:, :, :4], 100, small[:, :, 4:]
    got = read_key_set(big, big, torch.tensor([S - 1], dtype=torch.int32, device=DEVICE), 4, 8, block_n=8)
    assert got.sum().item() == 2 * small.sum().item()  # sums of small integers: exact


def test_the_grid_comes_from_shapes():
    """``cdiv(min(n_sink, S), block_n)`` sink blocks and ``cdiv(window + Lq - 1, block_n)`` recent ones a
    kv head, literal: 50 sinks of a 40-key cache make 10 blocks of 4, not 13."""
    k, v = _cache(40)
    assert read_key_set(k, v, torch.tensor([39], device=DEVICE), 50, 8, block_n=4).shape == (1, 2, 10 + 2)
    assert read_key_set(k, v, torch.tensor([39], device=DEVICE), 50, 8, block_n=16).shape == (1, 2, 3 + 1)
    assert read_key_set(k, v, torch.tensor([30, 31], device=DEVICE), 4, 8, block_n=4).shape == (1, 2, 1 + 3)


def test_each_batch_row_reads_its_own_keys():
    """A batch of 3 rows of unlike content, at the same positions: each row's programs read that row's
    sinks and window (NaN elsewhere in every row), literal keys [0, 4) and [23, 32)."""
    S, keys = 40, [0, 1, 2, 3] + list(range(23, 32))
    k, v = (torch.cat([x * (b + 1) for b in range(3)]) for x in _cache(S))  # (3, Hkv, S, D)
    outside = torch.ones(S, dtype=torch.bool, device=DEVICE)
    outside[keys] = False
    k_nan, v_nan = (x.masked_fill(outside[:, None], float("nan")) for x in (k, v))
    got = read_key_set(k_nan, v_nan, torch.tensor([30, 31], device=DEVICE), 4, 8, block_n=4)  # (3, Hkv, n_blk)
    assert got.shape == (3, 2, 1 + 3) and torch.isfinite(got).all(), "a key outside the key set was read"
    torch.testing.assert_close(got.sum((1, 2)), (k + v)[:, :, keys].sum((1, 2, 3)), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.sum(2), (k + v)[:, :, keys].sum((2, 3)), rtol=1e-5, atol=1e-4)  # per head


def test_random_positions_match_the_key_set_mask():
    S, n_sink, window = 100, 3, 20
    k, v = _cache(S, Hkv=3, seed=1)
    for end in (1, 17, 23, 64, 100):
        q_pos = torch.arange(max(0, end - 4), end, device=DEVICE)
        union = draft_key_mask(q_pos.cpu(), S, n_sink, window).any(dim=0).to(DEVICE)  # (S,)
        got = read_key_set(k, v, q_pos, n_sink, window, block_n=8).sum()
        torch.testing.assert_close(got, (k + v)[:, :, union].sum(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("bad", [
    lambda k, v, p: (k[0], v[0], p, 64),  # no batch dim
    lambda k, v, p: (k, v.transpose(2, 3).contiguous().transpose(2, 3), p, 64),  # v laid out unlike k
    lambda k, v, p: (k, v[:, :1], p, 64),  # v of one head, k's strides
    lambda k, v, p: (k[..., ::2], v[..., ::2], p, 64),  # strided in D
    lambda k, v, p: (k[..., :12], v[..., :12], p, 64),  # a head dim of 12
    lambda k, v, p: (k, v, p, 48),  # block_n not a power of two
    lambda k, v, p: (k, v, p, 0),  # nor 0
    lambda k, v, p: (k, v, p[:0], 64),  # no position
])
def test_bad_input_raises_value_error(bad, monkeypatch):
    """Refused on the host before any launch (a launch on an empty ``q_pos`` reads before it: a
    segfault under the interpreter, so the kernel is replaced by one that fails the test)."""
    from wmtp import bench_read

    class NoLaunch:
        def __getitem__(self, grid):
            pytest.fail(f"a kernel launched on bad input (grid {grid})")

    monkeypatch.setattr(bench_read, "_read_kernel", NoLaunch())
    k, v = _cache(40)
    k_, v_, p, block_n = bad(k, v, torch.tensor([39], device=DEVICE))
    with pytest.raises(ValueError, match="k and v must be alike|need power-of-two head dim and block_n"):
        read_key_set(k_, v_, p, 4, 8, block_n=block_n)


def test_read_floor_ms_takes_the_fastest_launch_or_the_first_error(monkeypatch):
    from wmtp import bench_read
    from wmtp.bench_read import READ_CONFIGS, read_floor_ms

    def timer_of(results):
        it = iter(results)
        return lambda fn: next(it)  # a timing that never runs fn: only the choice is tested

    assert len(READ_CONFIGS) == 3
    calls = []
    monkeypatch.setattr(bench_read, "read_key_set", lambda *a: calls.append(a))
    assert read_floor_ms("k", "v", "q_pos", 4, 16, lambda fn: fn() or 1.0) == 1.0  # a timing that runs fn once
    assert calls == [("k", "v", "q_pos", 4, 16, 64, 4), ("k", "v", "q_pos", 4, 16, 32, 8),
                     ("k", "v", "q_pos", 4, 16, 16, 4)]  # each of READ_CONFIGS: (block_n, num_warps)
    assert read_floor_ms(None, None, None, 4, 16, timer_of([0.3, "RuntimeError: a", 0.2])) == 0.2
    assert read_floor_ms(None, None, None, 4, 16, timer_of(["ValueError: b", "RuntimeError: c", "d"])) == \
        "ValueError: b"
