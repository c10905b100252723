"""The Triton attention's launch, planned on the host and checked as literal launches: ``launch_config``'s
defaults and bounds (NOTE [Launch] in wmtp/attention/plan.py), the float32 dot precision, ``plan_call``'s
constexprs and split workspace (wmtp/attention/triton_plan.py, on ``meta`` tensors with an H200's limits) and
the merge's launch (``_merge_plan``, wmtp/attention/triton_merge.py). No kernel runs here: the kernels
against the reference are tests/test_triton_attention.py (arXiv 2607.21535, Sec. 3)."""

import pytest
import torch

BF16, F32, F64, M = torch.bfloat16, torch.float32, torch.float64, 1 << 20


@pytest.mark.parametrize("args, expected", [
    # (B, Hq, Hkv, Lq, D, dtype, capacity, n_sink, window, sm_count) -> (block_m, block_n, splits, warps, stages)
    ((1, 16, 2, 1, 256, BF16, M, 64, 4096, 132), (16, 64, 66, 4, 1)),  # draft: one 64-key block a program
    ((1, 32, 8, 1, 128, BF16, M, 64, 4096, 132), (16, 64, 33, 4, 1)),  # two: 66 x 8 programs, over 2 a SM
    ((1, 16, 2, 8, 256, BF16, M, 64, 4096, 132), (64, 64, 67, 8, 1)),  # draft-extend: 8 warps for a 64 x 256 tile
    ((4, 16, 2, 8, 256, BF16, M, 64, 4096, 132), (64, 64, 17, 8, 1)),  # batch 4: 4 blocks, 136 programs, 1 a SM
    ((2, 32, 8, 8, 128, BF16, M, 64, 4096, 132), (32, 64, 17, 4, 1)),  # 67 x 16 // 264 = 4 blocks a program
    ((4, 32, 8, 1, 128, BF16, M, 64, 4096, 132), (16, 64, 8, 4, 3)),  # 65 x 32 blocks > 8 x 132: not "short"
    ((4, 32, 8, 2, 128, BF16, M, 64, 4096, 132), (16, 64, 8, 4, 1)),  # draft-extend, 2-32 queries, D >= 128: one stage
    ((16, 16, 2, 8, 256, BF16, M, 64, 4096, 132), (64, 32, 4, 4, 2)),  # 4 splits of 33 blocks: two stages
    ((10, 16, 2, 8, 256, BF16, M, 64, 4096, 132), (64, 32, 6, 4, 2)),  # 22 blocks of a D256 64-row tile: two
    ((17, 16, 2, 8, 256, BF16, M, 64, 4096, 132), (64, 32, 3, 4, 2)),  # 44 blocks of a D256 64-row tile: two
    ((20, 16, 2, 4, 256, BF16, M, 64, 4096, 132), (32, 32, 6, 4, 1)),  # 22 blocks of 32 rows: one
    ((1, 16, 2, 8, 256, BF16, M, 64, 473, 1), (64, 32, 1, 4, 1)),  # one program of 18 blocks, D256 64 rows: one
    ((1, 16, 2, 8, 256, BF16, M, 64, 474, 1), (64, 32, 1, 4, 2)),  # 19 blocks: two
    ((1, 16, 2, 8, 256, BF16, M, 64, 1305, 1), (64, 32, 1, 4, 2)),  # 44 blocks: two
    ((1, 16, 2, 8, 256, BF16, M, 64, 1306, 2), (64, 32, 1, 4, 3)),  # 45 blocks, 2 programs on 2 SMs: three
    ((1, 16, 2, 8, 256, BF16, M, 64, 1306, 1), (64, 32, 1, 4, 2)),  # on 1 SM (past a wave): two share it
    ((66, 16, 2, 8, 256, BF16, M, 64, 4096, 132), (64, 32, 1, 4, 3)),  # 132 blocks, 132 programs: three
    ((67, 16, 2, 8, 256, BF16, M, 64, 4096, 132), (64, 32, 1, 4, 2)),  # 134 programs, past a wave: two
    ((1, 16, 2, 8, 256, BF16, M, 64, 4096, None), (64, 32, 1, 4, 3)),  # interpreter (no SM count): three
    ((12, 32, 8, 16, 128, BF16, M, 64, 4096, 132), (64, 64, 2, 4, 1)),  # 34 blocks of a D128 64-row tile: one
    ((6, 32, 8, 32, 128, BF16, M, 64, 4096, 132), (128, 64, 2, 4, 1)),  # 34 blocks of a D128 128-row tile: one
    ((1, 32, 8, 16, 128, BF16, M, 64, 2417, 1), (64, 64, 1, 4, 1)),  # one program of 40 blocks, D128 64 rows: one
    ((1, 32, 8, 16, 128, BF16, M, 64, 2418, 1), (64, 64, 1, 4, 1)),  # 41 blocks: still one
    ((17, 32, 8, 16, 128, BF16, M, 64, 4096, 132), (64, 64, 1, 4, 1)),  # 67 blocks: one (the fit is 3)
    ((1, 32, 8, 32, 128, BF16, M, 64, 2401, 1), (128, 64, 1, 4, 1)),  # 40 blocks of a D128 128-row tile: one
    ((1, 32, 8, 32, 128, BF16, M, 64, 2402, 1), (128, 64, 1, 4, 1)),  # 41 blocks: still one
    ((9, 32, 8, 32, 128, BF16, M, 64, 4096, 132), (128, 64, 1, 4, 1)),  # 67 blocks, 72 programs: one (fit 4)
    ((12, 32, 8, 32, 128, BF16, M, 64, 4096, 132), (128, 64, 1, 4, 1)),  # a prefill's 12 32-query chunks: one
    ((17, 32, 8, 8, 128, BF16, M, 64, 4096, 132), (32, 64, 1, 4, 3)),  # 67 blocks of 32 rows: the fit
    ((32, 16, 2, 8, 256, BF16, M, 64, 4096, 132), (64, 32, 2, 4, 3)),  # 2 splits of 66 blocks: three
    ((4, 32, 8, 16, 128, BF16, M, 64, 4096, 132), (64, 64, 8, 4, 1)),  # 16 queries: one stage (experiment 58)
    ((4, 16, 8, 32, 128, BF16, M, 64, 4096, 132), (64, 64, 8, 4, 1)),  # 32 queries a tile: one stage
    ((4, 16, 8, 33, 128, BF16, M, 64, 4096, 132), (128, 64, 4, 4, 4)),  # 33: not measured, stages kept
    ((4, 32, 8, 32, 128, BF16, M, 64, 4096, 132), (128, 64, 4, 4, 1)),  # a prefill's 32-query chunk (4 of B 1)
    ((1, 32, 8, 8, 128, BF16, M, 64, 1401, 1), (32, 64, 1, 4, 1)),  # one program of 24 blocks: one stage's limit
    ((1, 32, 8, 8, 128, BF16, M, 64, 1402, 1), (32, 64, 1, 4, 2)),  # 25 blocks: two stages
    ((1, 32, 8, 8, 128, BF16, M, 64, 2400, 1), (32, 64, 1, 4, 2)),  # one program of 40 blocks: the loop's limit
    ((1, 32, 8, 8, 128, BF16, M, 64, 2464, 1), (32, 64, 1, 4, 3)),  # 41 blocks
    ((4, 32, 8, 8, 128, BF16, 16384, None, None, 132), (32, 64, 8, 4, 3)),  # a verify of 32-block loops keeps them
    ((16, 4, 4, 8, 64, BF16, M, 64, 4096, 132), (16, 64, 4, 4, 3)),  # D64 keeps its stages
    ((4, 32, 8, 8, 128, F32, M, 64, 4096, 132), (32, 16, 8, 4, 3)),  # and fp32 (FMA tiles)
    ((4, 32, 8, 8, 128, F64, M, 64, 4096, 132), (32, 16, 8, 4, 3)),  # and fp64 (33 blocks a program)
    ((4, 32, 8, 9, 128, BF16, M, 64, 4096, 132), (64, 64, 8, 4, 1)),  # 9 queries a tile: one stage
    ((4, 32, 8, 8, 128, BF16, M, None, 4096, 132), (32, 64, 8, 4, 1)),  # a window without sinks: one stage
    ((1, 32, 8, 8, 128, BF16, M, 64, 5049, 8), (32, 64, 2, 4, 3)),  # 81 blocks, 2 splits: 41 (not 40) a program
    ((1, 32, 8, 8, 128, BF16, 2048, 64, 4096, None), (32, 64, 1, 4, 2)),  # interpreter: 33 blocks, two stages
    ((4, 4, 4, 1, 64, BF16, M, 64, 4096, 132), (16, 64, 66, 4, 1)),  # one row's partial, 1/62 of a block: one a program
    ((4, 4, 4, 4, 64, BF16, M, 64, 4096, 132), (16, 64, 17, 4, 1)),  # four rows' (1/15.5): 4 blocks a program
    ((4, 8, 4, 1, 64, BF16, M, 64, 4096, 132), (16, 64, 17, 4, 1)),  # two rows' (1/31): over the 1/32 line
    ((3, 16, 2, 1, 256, BF16, M, 64, 4096, 132), (16, 64, 33, 4, 1)),  # 396 programs: 1.5 waves of 264 count as 2
    ((3, 16, 2, 1, 256, BF16, M, 64, 4096, 133), (16, 64, 66, 4, 1)),  # just under 1.5 waves of 266: one a program
    ((5, 16, 2, 1, 256, BF16, M, 64, 4096, 132), (16, 64, 33, 4, 1)),  # 660 programs, 2.5 waves: two (by floor)
    ((5, 16, 2, 2, 256, BF16, M, 64, 4096, 132), (16, 64, 34, 4, 1)),  # 670 programs, 2.54 waves: two, not three
    ((8, 8, 2, 8, 256, BF16, M, 64, 4096, 132), (32, 64, 17, 8, 1)),  # a 32 KiB accumulator (32 x 256): still 2 a SM
    ((1, 32, 8, 1, 128, BF16, M, None, None, 132), (16, 64, 33, 4, 3)),  # verify: 2 programs per SM, 264 = 2 * 132
    ((1, 32, 8, 8, 128, BF16, M, None, None, 132), (32, 64, 33, 4, 3)),
    ((1, 16, 2, 1, 256, BF16, M, None, None, 132), (16, 32, 132, 4, 3)),
    ((1, 16, 2, 8, 256, BF16, M, None, None, 132), (64, 32, 66, 4, 4)),  # 64 KiB accumulator: 1 program per SM
    ((1, 32, 8, 1, 128, F32, M, 64, 4096, 132), (16, 16, 33, 4, 3)),  # fp32 (ieee): small blocks, never "short"
    ((1, 4, 2, 8, 16, F64, 60, None, None, 132), (16, 32, 2, 4, 3)),  # the lossless tests' tiny model on CUDA
    ((1, 32, 8, 1, 128, BF16, M, 64, 4096, None), (16, 64, 1, 4, 3)),  # CPU interpreter: one split
    ((1, 2, 1, 1, 64, BF16, 4096, None, None, 7), (16, 64, 13, 4, 3)),  # 14 programs of 5 of 64 blocks: 1 empty
    ((1, 2, 1, 1, 64, BF16, M, 0, 512, 1), (16, 64, 3, 4, 1)),  # 9 blocks of 64 keys on 1 SM: "short", 3 a program
])
def test_launch_config_defaults(args, expected):
    """NOTE [Launch]'s defaults as literal launches (the H200 shapes of the benchmark, 132 SMs)."""
    from wmtp.attention.plan import launch_config

    assert tuple(launch_config(*args)) == expected
    assert tuple(launch_config(*args, num_splits=3, block_n=16, num_warps=2, num_stages=1))[1:] == (16, 3, 2, 1)


def test_a_short_ranges_partial_counts_m_and_l_beside_acc():
    """NOTE [Launch]: a split writes m, l and acc, ``D + 2`` fp32 words a real row. At D 16 the two words
    tip 30 rows over 1/32 of a 1024-key block's K and V (30 x 18 x 4 x 32 = 69120 > 65536 bytes; acc
    alone, 61440, is under): heavy partials, so the 2 blocks of 2 x 2 programs take one split, not two."""
    from wmtp.attention.plan import launch_config

    assert tuple(launch_config(2, 30, 2, 2, 16, BF16, 4096, 0, 64, 1, block_n=1024)) == (32, 1024, 1, 4, 1)
    assert tuple(launch_config(2, 30, 2, 2, 16, BF16, 4096, 0, 64, 1, block_n=2048)) == (32, 2048, 2, 4, 1)


def test_float32_dots_take_tf32x3_only_where_measured():
    """NOTE [tf32x3]: float32 tiles of 16 to 64 rows at D <= 64 off the CPU; everything else as before."""
    from wmtp.attention.triton_plan import precision

    assert precision(F32, "cuda", 16, 64) == precision(F32, "meta", 16, 16) == "tf32x3"
    assert precision(F32, "cuda", 32, 64) == precision(F32, "cuda", 64, 64) == "tf32x3"  # a prefill's, a GQA verify's
    assert precision(F32, "cpu", 16, 64) == precision(F32, "cpu", 64, 64) == "ieee"  # the interpreter
    assert precision(F32, "cuda", 128, 32) == precision(F32, "cuda", 16, 128) == "ieee"  # 128: past max_tile_rows
    assert precision(F64, "cuda", 16, 64) == "ieee" and precision(BF16, "cuda", 16, 64) == "tf32"


def test_a_second_query_tile_takes_its_shared_memory_from_the_stages():
    """Re-indexed sinks (q_sink) hold two query tiles: the fp32 D256 draft-extend (64 x 256 rows, 64 KiB a
    tile) drops from 4 stages of 16-key blocks to 2 (it compiled 1.3 KB over an H200's limit with 4);
    the bf16 launches of the benchmark keep theirs."""
    from wmtp.attention.plan import launch_config

    fp32 = (1, 16, 2, 8, 256, F32, M, 64, 4096, 132)
    assert tuple(launch_config(*fp32)) == (64, 16, 66, 4, 4)
    assert tuple(launch_config(*fp32, q_tiles=2)) == (64, 16, 66, 4, 2)
    for args in [(1, 16, 2, 1, 256, BF16, M, 64, 4096, 132), (1, 16, 2, 8, 256, BF16, M, 64, 4096, 132)]:
        assert launch_config(*args, q_tiles=2) == launch_config(*args)


def test_launch_config_rejects_bad_overrides_and_fits_smaller_gpus():
    from wmtp.attention.plan import launch_config

    args = (1, 16, 2, 1, 256, BF16, M, 64, 4096, 132)
    for bad in (dict(num_splits=0), dict(num_splits=-2), dict(block_n=8), dict(block_n=48)):
        with pytest.raises(ValueError, match="num_splits|block_n"):
            launch_config(*args, **bad)
    with pytest.raises(ValueError, match="no positions"):
        launch_config(1, 16, 2, 1, 256, BF16, 0, None, None, 132)
    # 64 KiB of shared memory: the draft's 64-key K and V blocks at D 256 (64 KiB) cannot fit; 32-key ones can
    assert tuple(launch_config(*args, smem_bytes=64 * 1024)) == (16, 32, 131, 4, 1)
    # a draft-extend looping over 34 blocks of 128 keys (64 KiB of K and V a stage): two stages, or one
    # where shared memory holds one (99 KiB, an sm_86's opt-in limit)
    extend = (1, 32, 8, 8, 128, BF16, M, 64, 4096, 1)
    assert tuple(launch_config(*extend, block_n=128)) == (32, 128, 1, 4, 2)
    assert tuple(launch_config(*extend, block_n=128, smem_bytes=99 * 1024)) == (32, 128, 1, 4, 1)


def test_max_tile_rows():
    """Rows per tile: a 64 KiB accumulator, and at most 64 rows for ieee fp32 / fp64 (NOTE [Launch])."""
    from wmtp.attention.plan import max_tile_rows

    assert [max_tile_rows(BF16, D) for D in (32, 64, 128, 256)] == [256, 256, 128, 64]
    assert [max_tile_rows(F32, D) for D in (32, 128, 256)] == [64, 64, 64]
    assert [max_tile_rows(F64, D) for D in (16, 128, 256)] == [64, 64, 32]


def test_merge_plan_literal():
    """``_merge_plan``, the merge's launch: a program per (attention program, real tile row, slice of
    the head dim), slices of ``min(D, max(16, 4096 // chunk))`` dims, chunks of ``min(next_pow2(splits),
    max_chunk)`` splits, ``n_rows`` partial rows; with query chunks (NOTE [Chunks]) one program a
    chunk's tile. ``max_chunk`` sizes a ``tl.arange``: not a power of two is a ValueError."""
    from wmtp.attention.triton_merge import _merge_plan

    out_stride = (3 * 4 * 64, 64, 4 * 64, 1)  # (B, Hq, Lq, D) = (1, 4, 3, 64) in (B, Lq, Hq, D) memory
    grid, ints, kwargs = _merge_plan((1, 4, 3, 64), out_stride, 2, 16, 130, False, 256)  # 2 kv heads, 16-row tiles
    assert grid == (2, 6, 4) and ints == (*out_stride, 2, 3, 130, 2 * 130 * 16, 3)
    assert (kwargs["GROUP"], kwargs["SPLIT_CHUNK"], kwargs["BLOCK_D"], kwargs["CHUNKED"]) == (2, 256, 16, False)
    grid, ints, kwargs = _merge_plan((1, 4, 3, 64), out_stride, 2, 16, 5, False, 2, 2)  # chunks of 2 queries
    assert grid == (4, 4, 1) and ints[4:] == (2, 2, 5, 4 * 5 * 16, 3)
    assert (kwargs["SPLIT_CHUNK"], kwargs["BLOCK_D"], kwargs["CHUNKED"]) == (2, 64, True)
    for bad in (0, 3, 96):
        with pytest.raises(ValueError, match="power of two"):
            _merge_plan((1, 4, 3, 64), out_stride, 2, 16, 5, False, bad)
    # a head dim that is not a power of two >= 16: 48 in slices of 32 (100 splits) left columns 32-47
    # unwritten; 8 would fail inside the kernel
    for D in (48, 24, 8):
        with pytest.raises(ValueError, match=f"^the merge takes a head dim that is a power of two >= 16, got {D}$"):
            _merge_plan((1, 4, 3, D), out_stride, 2, 16, 100, False, 256)


def test_merge_splits_refuses_a_workspace_of_another_size_or_layout():
    """``merge_splits``' workspace check is a ValueError (an assertion vanishes under ``python -O``):
    ``n_rows * (D + 2)`` contiguous elements, ``n_rows`` = B * Hkv * splits * block_m = 2 * 5 * 16."""
    from wmtp.attention.triton_merge import merge_splits

    out = torch.empty(1, 4, 3, 32, device="meta")  # (B, Hq, Lq, D)
    for ws, why in ((torch.empty(160 * 34 - 1, device="meta"), "got 5439$"),
                    (torch.empty(2, 160 * 34, device="meta")[:, 0], "got 2 \\(not contiguous\\)$")):
        with pytest.raises(ValueError, match="^ws must be contiguous m, l and acc: 5440 elements, " + why):
            merge_splits(ws, out, 2, 16, 5, pdl=False)


def _meta_plan(dtype=torch.float32, *, Hq=4, Lq=2, paged=False, num_splits=3, num_stages=None, n_sink=4,
               window=64, q_sink=False, limits=(132, 232448, True)):
    """``plan_call`` of a (1, Hq, Lq, 32) query block over 2 kv heads of 300 positions (paged: 19
    pages of 16), on ``meta`` tensors with an H200's limits (or ``limits=None``: the interpreter's)."""
    from wmtp.attention.triton_plan import plan_call

    meta = dict(device="meta", dtype=dtype)
    q = torch.empty(1, Hq, Lq, 32, **meta)  # (B, Hq, Lq, D)
    pos = torch.empty(Lq, device="meta", dtype=torch.int64)
    if paged:
        k, table = torch.empty(19, 16, 2, 32, **meta), torch.empty(1, 19, device="meta", dtype=torch.int32)
    else:
        k, table = torch.empty(1, 2, 300, 32, **meta), None  # (B, Hkv, S, D)
    return plan_call(q, k, k, table, 16 if paged else 1, pos, n_sink, window, (num_splits, None, None, num_stages,
                     None), limits, torch.empty_like(q) if q_sink else None)


def test_the_plans_constexprs_follow_their_notes():
    """The plan's switches that change no output bit on the CPU interpreter, each as its note says:
    NOTE [Pages] (PAGED 1 with one stage, 2 with more, 0 contiguous), NOTE [PDL] (only where a merge
    follows), UPCAST only under the interpreter (which cannot multiply bf16), QSINK only with sinks to
    score (NOTE [Re-indexed sinks])."""
    assert [_meta_plan(paged=True, num_stages=s).kwargs["PAGED"] for s in (1, 2, 3)] == [1, 2, 2]
    assert _meta_plan(num_stages=1).kwargs["PAGED"] == 0
    assert [_meta_plan(num_splits=s).kwargs["PDL"] for s in (1, 3)] == [False, True]
    assert _meta_plan(num_splits=1).merge is None
    assert not _meta_plan(BF16).kwargs["UPCAST"] and not _meta_plan(F32, limits=None).kwargs["UPCAST"]
    assert [_meta_plan(q_sink=True, n_sink=n, window=w).kwargs["QSINK"] for n, w in ((4, 64), (0, 64), (4, None))] \
        == [True, False, False]


def test_the_split_workspace_holds_m_l_and_acc_of_every_partial_row():
    """NOTE [Workspace]: 3 splits of a 16-row tile (4 heads x 2 queries) on 2 kv heads are 96 partial
    rows: the kernel's n_rows is 96, and the workspace 96 maxima, 96 denominators and 96 x 32 sums."""
    call = _meta_plan(num_splits=3)
    ws, out = call.merge.args[:2]
    assert call.grid == (2, 3) and call.args[-2] == 96 and call.merge.args[-2] == 96
    assert ws.numel() == 96 * (32 + 2) and ws.dtype == torch.float32 and out is call.out
