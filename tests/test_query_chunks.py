"""A query block longer than one tile, in ONE launch (NOTE [Chunks] in attention/triton_attention.py).

A prefill's queries are cut into chunks of ``query_chunk`` queries; grid axis 0 runs over (chunk,
batch, kv head), the last chunk first. Each chunk's tile plans the same key ranges and blocks as a
launch of that chunk alone, so with the same splits the one launch must equal the chunks launched
one by one bit for bit (and the reference within the kernel rule of truth, tests/attention_truth.py).
"""

import os

import pytest
import torch
import triton
import triton.language as tl
from attention_truth import assert_kernel_close, make_inputs
from op_impls import spy_attention_plans

from wmtp.attention import triton_attention as ta
from wmtp.attention.paged import paginate
from wmtp.attention.plan import max_tile_rows, query_chunk
from wmtp.attention.triton_merge import _tile_rows

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
NEEDS_TRITON = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                                  reason="Triton needs CUDA or its CPU interpreter (TRITON_INTERPRET=1)")
H200 = (132, 232448, True)  # SMs, opt-in shared memory per block (bytes), programmatic dependent launch


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="a premise of the CPU interpreter's tl.dot")
def test_a_product_row_has_the_same_bits_in_a_tile_of_any_row_count():
    """What the bit-for-bit tests below rest on under the CPU interpreter, whose ``tl.dot`` is numpy's
    matmul: a row of a 64-row product equals the same row of an 8-, 16- or 32-row one. OpenBLAS's AVX2
    kernels broke it (tests/conftest.py pins OPENBLAS_CORETYPE on x86-64)."""
    import numpy as np

    rng = np.random.default_rng(0)
    for n, kd in [(16, 32), (32, 64), (64, 16), (90, 32)]:
        a = rng.standard_normal((64, kd), dtype=np.float32)  # (rows, K)
        b = rng.standard_normal((kd, n), dtype=np.float32)  # (K, N)
        whole = a @ b  # (64, N)
        for rows in (8, 16, 32):
            assert np.array_equal(whole[:rows], a[:rows] @ b), (n, kd, rows)


def _op(layout, q, k, v, q_pos, n_sink, window, num_splits, q_sink=None):
    """The Triton op with ``num_splits`` splits and 16-key blocks, on the cache or a paged copy of it."""
    if layout == "contiguous":
        return ta.attention_triton(q, k, v, q_pos, n_sink, window, num_splits=num_splits, block_n=16, q_sink=q_sink)
    k_pages, v_pages, table = paginate(k, v, 16, torch.Generator().manual_seed(3))
    return ta.paged_attention_triton(q, k_pages, v_pages, table, q_pos, n_sink, window, num_splits=num_splits,
                                     block_n=16, q_sink=q_sink)


@NEEDS_TRITON
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not CUDA, reason="the CPU interpreter cannot multiply bf16"))])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("n_sink, window", [(None, None), (4, 16)])
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_one_launch_equals_the_chunks_launched_one_by_one(layout, n_sink, window, num_splits, dtype, monkeypatch):
    """2.5 chunks of queries of 4 heads a kv head: at float32 (D 32, a 64-row tile) 40 queries in
    chunks of 16, at bfloat16 (256 rows) 160 in chunks of 64; the last chunk half padding rows. Two
    batch rows at their own positions."""
    B, Hq, Hkv, D = 2, 8, 2, 32
    Lc = max_tile_rows(dtype, D) // (Hq // Hkv)
    Lq, S = Lc * 5 // 2, Lc * 5 // 2 + 50
    q, k, v, _ = make_inputs(B, Hq, Hkv, Lq, S, D, dtype, seed=7, device=DEVICE)
    q_pos = torch.stack([torch.arange(5, 5 + Lq), torch.arange(S - Lq, S)]).to(DEVICE)  # (B, Lq)
    assert query_chunk(Lq, Hq // Hkv, dtype, D) == Lc
    plans = spy_attention_plans(monkeypatch)
    whole = _op(layout, q, k, v, q_pos, n_sink, window, num_splits)  # (B, Hq, Lq, D)
    n_chunks = -(-Lq // Lc)
    assert [p.grid for p in plans] == [(n_chunks * B * Hkv, num_splits)]  # one launch
    chunks = torch.cat([_op(layout, q[:, :, i: i + Lc], k, v, q_pos[:, i: i + Lc], n_sink, window, num_splits)
                        for i in range(0, Lq, Lc)], dim=2)  # (B, Hq, Lq, D)
    assert len(plans) == 1 + n_chunks
    assert torch.equal(whole, chunks)
    for b in range(B):
        rows = slice(b, b + 1)
        assert_kernel_close(whole[rows], q[rows], k[rows], v[rows], q_pos[b], n_sink, window)


@NEEDS_TRITON
def test_chunks_with_reindexed_sinks_and_shared_positions(monkeypatch):
    """``q_sink`` (NOTE [Re-indexed sinks]) and ``(Lq,)`` positions, 70 queries of 4 heads: 5 chunks."""
    B, Hq, Hkv, Lq, S, D, n_sink, window = 1, 4, 1, 70, 120, 32, 4, 16
    q, k, v, q_pos = make_inputs(B, Hq, Hkv, Lq, S, D, torch.float32, seed=8, device=DEVICE)
    q_sink = torch.randn(q.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    plans = spy_attention_plans(monkeypatch)
    whole = _op("contiguous", q, k, v, q_pos, n_sink, window, 2, q_sink)
    assert [p.grid for p in plans] == [(5, 2)]
    chunks = torch.cat([_op("contiguous", q[:, :, i: i + 16], k, v, q_pos[i: i + 16], n_sink, window, 2,
                            q_sink[:, :, i: i + 16]) for i in range(0, Lq, 16)], dim=2)
    assert torch.equal(whole, chunks)
    assert_kernel_close(whole, q, k, v, q_pos, n_sink, window, q_sink)


def test_the_h200_plans_of_a_prefill_and_of_a_chunked_verify():
    """On ``meta`` tensors with an H200's limits: the small preset's 16K-token prefill (float32, 4
    kv heads of D 64) is 256 chunks of 64 queries a kv head, 1024 programs, so no split and no
    merge; a verify of 16 queries x 16 heads a kv head at D 128 (bf16) is 2 chunks of 8 queries
    that keep split-K, and the merge runs over the same (chunk, batch, kv head) programs, the
    workspace holding both chunks' partial rows (each of those three wrong segfaulted the interpreter
    in mutation round 9b instead of failing a test)."""
    meta = dict(device="meta")
    q = torch.empty(1, 4, 16384, 64, dtype=torch.float32, **meta)  # (B, Hq, Lq, D)
    k = torch.empty(1, 4, 16384, 64, dtype=torch.float32, **meta)  # (B, Hkv, S, D)
    pos = torch.empty(16384, dtype=torch.int64, **meta)
    call = ta.plan_call(q, k, k, None, 1, pos, None, None, (None,) * 5, H200)
    assert call.grid == (256 * 4, 1) and call.merge is None and call.kwargs["CHUNKED"]
    assert call.args[-1] == 16384 and call.out.shape == q.shape  # n_queries: the block's
    q = torch.empty(1, 32, 16, 128, dtype=torch.bfloat16, **meta)
    k = torch.empty(1, 2, 1 << 20, 128, dtype=torch.bfloat16, **meta)
    call = ta.plan_call(q, k, k, None, 1, torch.empty(16, dtype=torch.int64, **meta), None, None, (None,) * 5, H200)
    assert call.grid[0] == 2 * 2 and call.grid[1] > 1 and call.merge.grid[:2] == (2 * 2, 16 * 8)
    assert call.kwargs["CHUNKED"] and call.merge.kwargs["CHUNKED"] and call.merge.args[-1] == 16
    n_rows = 2 * 1 * 2 * call.grid[1] * 128  # NOTE [Workspace]: chunks x B x Hkv x splits x 128-row tiles
    assert call.args[-8:-6] == (2, 8) and call.args[-3:] == (call.grid[1], n_rows, 16)  # Hkv, a chunk's queries
    assert call.merge.args[0].numel() == n_rows * (128 + 2)  # m, l and acc of every partial row, of both chunks
    q1 = torch.empty(1, 32, 8, 128, dtype=torch.bfloat16, **meta)  # one tile: no chunks
    call = ta.plan_call(q1, k, k, None, 1, torch.empty(8, dtype=torch.int64, **meta), None, None, (None,) * 5, H200)
    assert not call.kwargs["CHUNKED"] and call.grid[0] == 2 and not call.merge.kwargs["CHUNKED"]


def test_query_chunk():
    assert query_chunk(100, 4, torch.float32, 32) == 16  # 64 fp32 rows a tile
    assert query_chunk(10, 4, torch.float32, 32) == 10  # one tile holds them all
    assert query_chunk(300, 8, torch.bfloat16, 256) == 8  # 64 rows of 256 dims
    with pytest.raises(ValueError, match="exceed the kernel's tile"):
        query_chunk(1, 65, torch.float32, 32)


@NEEDS_TRITON
@pytest.mark.parametrize("token_major", [True, False])
@pytest.mark.parametrize("Hq, Hkv, Lq", [(6, 2, 50), (64, 1, 3)])
def test_odd_chunks_and_both_output_layouts(Hq, Hkv, Lq, token_major, monkeypatch):
    """A group that does not divide the float32 tile (3 heads: chunks of 21 queries, 63 of 64 rows,
    the last chunk 8) and chunks of one query (64 heads fill the tile), in both output layouts
    (NOTE [Output layout]), with splits: bit for bit the chunks launched one by one."""
    from wmtp.attention import triton_plan

    monkeypatch.setattr(triton_plan, "TOKEN_MAJOR", token_major)
    B, S, D = 1, Lq + 30, 32
    q, k, v, q_pos = make_inputs(B, Hq, Hkv, Lq, S, D, torch.float32, seed=Hq, device=DEVICE)
    Lc = query_chunk(Lq, Hq // Hkv, torch.float32, D)
    assert Lc == {6: 21, 64: 1}[Hq]
    whole = _op("contiguous", q, k, v, q_pos, 2, 8, 2)
    chunks = torch.cat([_op("contiguous", q[:, :, i: i + Lc], k, v, q_pos[i: i + Lc], 2, 8, 2)
                        for i in range(0, Lq, Lc)], dim=2)
    assert torch.equal(whole, chunks) and whole.transpose(1, 2).is_contiguous() == token_major
    assert_kernel_close(whole, q, k, v, q_pos, 2, 8)


@triton.jit
def _rows_probe(OUT,  # (programs, 3, R) int32: each row's (batch, kv head), query index and realness
                Lq, n_queries, GROUP: tl.constexpr, R: tl.constexpr, CHUNKED: tl.constexpr):
    rows = tl.arange(0, R)
    bh, qi, real = _tile_rows(tl.program_id(0), rows, Lq, n_queries, GROUP, CHUNKED)
    base = OUT + tl.program_id(0) * 3 * R
    tl.store(base + rows, bh + rows * 0)
    tl.store(base + R + rows, qi.to(tl.int32))
    tl.store(base + 2 * R + rows, real.to(tl.int32))


@NEEDS_TRITON
def test_tile_rows_map_programs_to_chunks_last_chunk_first():
    """NOTE [Chunks]: ``_tile_rows``, which the kernel and the merge share. 7 queries of 2 heads a kv
    head in chunks of 3 on 2 (batch, kv head) pairs: 6 programs, chunk slot 0 the LAST chunk (query
    6 and padding that repeats it, not real), slot 2 the first; one tile without chunks: padding rows
    past group x Lq are not real. (Which slot holds which chunk shows in no output: the kernel and the
    merge agree on it whatever it is; the last chunk first is NOTE [Chunks]' schedule.)"""
    out = torch.empty(6, 3, 8, dtype=torch.int32, device=DEVICE)  # (program, bh | qi | real, row)
    _rows_probe[(6,)](out, 3, 7, GROUP=2, R=8, CHUNKED=True)
    assert out[:, 0, 0].tolist() == [0, 1, 0, 1, 0, 1]  # (batch, kv head) of each program
    assert out[0, 1].tolist() == [6] * 8 and out[2, 1].tolist() == [3, 4, 5, 3, 4, 5, 3, 4]
    assert out[5, 1].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert out[0, 2].tolist() == [1, 0, 0, 1, 0, 0, 0, 0] and out[4, 2].tolist() == [1] * 6 + [0] * 2
    _rows_probe[(2,)](out, 3, 3, GROUP=2, R=8, CHUNKED=False)
    assert out[1, 0].tolist() == [1] * 8 and out[1, 1].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert out[1, 2].tolist() == [1] * 6 + [0] * 2
