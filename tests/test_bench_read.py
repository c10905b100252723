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
    """NOTE [Offsets]: head 2 of 3 heads of 2^26 x 16 starts 2^31 elements in (a lazily allocated
    6 GiB tensor, of which only the first 64 positions of each head are written)."""
    small = next(_cache(64, Hkv=3, D=16, seed=2)).half()  # (1, 3, 64, 16)
    big = torch.empty(1, 3, 1 << 26, 16, dtype=torch.float16, device=DEVICE)
    big[:, :, :64] = small
    got = read_key_set(big, big, torch.tensor([63], device=DEVICE), 4, 8, block_n=16)  # (Hkv, n_blk)
    keys = [0, 1, 2, 3] + list(range(56, 64))
    torch.testing.assert_close(got.sum(1), 2 * small[0][:, keys].float().sum((1, 2)), rtol=1e-5, atol=1e-4)


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
    lambda k, v, p: (k, v, p, 48),  # block_n not a power of two
    lambda k, v, p: (k, v, p[:0], 64),  # no position
])
def test_bad_input_raises_value_error(bad):
    k, v = _cache(40)
    k_, v_, p, block_n = bad(k, v, torch.tensor([39], device=DEVICE))
    with pytest.raises(ValueError):
        read_key_set(k_, v_, p, 4, 8, block_n=block_n)


def test_read_floor_ms_takes_the_fastest_launch_or_the_first_error():
    from wmtp.bench_read import READ_CONFIGS, read_floor_ms

    def timer_of(results):
        it = iter(results)
        return lambda fn: next(it)  # a timing that never runs fn: only the choice is tested

    assert len(READ_CONFIGS) == 3
    assert read_floor_ms(None, None, None, 4, 16, timer_of([0.3, "RuntimeError: a", 0.2])) == 0.2
    assert read_floor_ms(None, None, None, 4, 16, timer_of(["ValueError: b", "RuntimeError: c", "d"])) == \
        "ValueError: b"
