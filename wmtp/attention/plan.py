"""Host-side plans of the Triton kernel (arXiv 2607.21535, Sec. 3): which key blocks a tile of
queries reads, and how a call is launched.

The kernel (attention/triton_attention.py) plans its two key ranges on device from the positions
it loads (NOTE [Host sync] there); ``key_plan`` is the same computation in Python, the readable
reference that tests/test_triton_attention.py checks the device plan against. ``launch_config``
picks tile sizes, split count and Triton options from shapes alone (NOTE [Launch]).
``check_tensors`` is the kernels' input contract and ``query_chunk`` cuts a query block longer
than one tile into chunks, which one launch runs.

NOTE [Launch]: ``launch_config`` picks the launch from shapes; ``plan_call``
(attention/triton_plan.py) turns it into the kernel's arguments. ``n_blk`` bounds the key blocks by
``min(S, n_sink + window + Lq - 1)`` keys (``S`` for the full set); a split left without keys
writes ``m = -inf, l = 0``.
Defaults (H200 runs; metrics/README.md lists the files):
- a short range (the draft: at most 8 blocks of 64 keys per SM over all heads) runs blocks of 64
  keys (32 where shared memory is smaller), 4 warps (8 for tiles over 16 x 256), ONE stage: every
  2-stage launch measured was slower (draft-floor-h200-a353de9.json), and 64-key blocks beat
  128-key ones (draft-floor-h200-d011fa8.json). One block a program, unless a split's partial
  (m, l and acc of the tile's real rows, fp32) is at least 1/32 of a block's K and V bytes (a
  choice between the measured 1/62 and 1/16) and one block a program makes 1.5 waves of programs
  or more (two resident an SM for an accumulator of at most 32 KiB, else one; 1.5-1.99 count as
  two, then by floor): then whole blocks a program, as many as keep a wave full (experiments 54, 56);
- a long range (verify) runs in whole waves: one or two resident programs per SM (two when the
  accumulator is <= 32 KiB and two 3-stage K/V pipelines fit in shared memory), each streaming its
  blocks through ``num_stages`` buffers (tune-attention-h200-{graph-12d4ff2,plain-24aeee8}.json);
  a long windowed tile (2-32 queries a tile, D >= 128, tensor cores: a draft-extend, a windowed
  prefill's chunks) takes its stages by depth and loop (blocks a program):
  - up to 32 rows: 1 stage up to 24 blocks (H100, experiments 55, 57, 58; H200, 58), 2 over 25-40
    (experiment 59, 27-34 blocks: 1-7 % faster than one on an H200, where one lost up to 11 % to
    three; -3 to +3 % on the H100), the fit past 40 (two lost 6-19 % at 44-67 on an H200; the
    H100 read -6 % for D256 2-4 queries at 44; past a wave, experiment 61 on an H100, the fit was
    fastest in three cells of six, two stages 2.0-2.8 % and one 8.4-8.5 % faster in the others);
  - 64 rows at D256 (32-key blocks, 4 warps): 1 stage up to 18 blocks, 2 over 19-44 (experiments
    59-60: 9-19 % faster than the plan's one at 19-22 and its fit at 44 on an H100 (contiguous;
    0.3 % in pages at 22), 12-13 % at 22 and 44 on an H200), 3 past 44 (experiments 60-61, H100:
    5.4-12.1 % faster than four at 66-132 blocks, contiguous, paged and prefill chunks), but 2 past a
    wave of programs (more than the SMs): two stages compile to 96.5 KiB of shared memory, so two
    programs share an SM, where one of three (129 KiB) or four (161 KiB) holds it alone (experiment
    61, H100: two 25-46 % faster than four at 134-400 programs; three at 132 programs -5.4 to
    -7.7 %);
  - 64-128 rows at D128: 1 stage at every loop measured (14-67 blocks). 64 rows: experiments
    59-61, two 1.4-8.9 % slower at 34 blocks on an H100, -0.8 / +3.7 % on an H200; at 67 one beat
    the fit of three by 3.4-14.6 % (H100). 128 rows (experiments 60-61, H100): two 4-5 % slower at
    34 blocks (22 % in pages); at 67 one beat two by 9-15 % in pages, 13-16 % in windowed
    prefills' 32-query chunks (38-40 % in pages), and tied past a wave (-2.8 to +1.1 %), but lost
    9-11 % below a wave in one contiguous 32-query tile (72 programs); one took 25-69 % less time
    than the fit of four at 67 blocks in all of these but that one;
- fp32 and fp64 tiles are planned as FMA tiles (ieee dots, without tensor cores; fp32 at D <= 64
  takes tf32x3 on a GPU, NOTE [tf32x3] in attention/triton_plan.py): 16-32-key blocks and at most
  64 rows a tile (``max_tile_rows``) keep compile times in seconds; the CPU interpreter runs one
  split. A narrower fp32 launch (2 warps, 2 stages, 4 programs an SM) took 28.8-36 % less time
  over 16K-131K keys, 20 calls back to back (fp32-full-sweep-h200-exp29.json) but up to 9.4 %
  slower a token in the decode loop, one call at a time (narrow-fp32-h200-exp30.json): a launch is
  judged in the loop.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..keyset import key_ranges

__all__ = ["KeyPlan", "key_plan", "LaunchConfig", "launch_config", "max_tile_rows", "check_tensors",
           "query_chunk", "MAX_POSITIONS"]

MAX_POSITIONS = 1 << 30  # most key positions a Triton-read cache holds: its positions are int32 in the kernel

SMEM_H200 = 232448  # opt-in shared memory per block of an H100/H200 (227 KiB), the tuned machine
SMEM_HEADROOM = 32 * 1024  # shared memory left for the query tile and layout conversions
MAX_ROWS = 256  # most query rows (group * Lq) in one tile; longer query blocks (prefill) are chunked
MAX_TILE_BYTES = 128 * 128 * 4  # most bytes of the (rows, D) accumulator: 64 KiB of registers


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


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


class LaunchConfig(NamedTuple):
    """Tile sizes, grid and Triton options of one launch (NOTE [Launch])."""

    block_m: int  # rows of the query tile: group * Lq, padded to a power of two >= 16
    block_n: int  # keys per block
    num_splits: int  # programs per (batch, kv head), merged by log-sum-exp when > 1
    num_warps: int
    num_stages: int


def max_tile_rows(dtype: torch.dtype, D: int) -> int:
    """Most query rows (query heads of a kv head x queries) one tile holds at head dim ``D``: the
    accumulator stays within ``MAX_TILE_BYTES``, and ieee fp32 / fp64 tiles (no bf16 tensor cores)
    within 64 rows, which keeps their compile times in seconds (NOTE [Launch])."""
    fma = dtype in (torch.float32, torch.float64)
    return min(64 if fma else MAX_ROWS, MAX_TILE_BYTES // ((8 if dtype == torch.float64 else 4) * D))


def _extend_stages(block_m: int, D: int, n_blk: int, programs: int, sm_count: int | None,
                   fit: int) -> tuple[int, int, int]:
    """A windowed 2-32-query tile's stage rule by depth (NOTE [Launch]): one stage up to ``one`` blocks
    a program, two up to ``two``, ``deep`` past it. Past a wave of programs (more than ``sm_count``) a
    D256 64-row tile takes two stages, which let two programs share an SM (96.5 KiB of shared memory each)."""
    if D > 128 and block_m >= 64:  # 64 rows at D256, 32-key blocks
        return 18, 44, 3 if sm_count is None or programs <= sm_count else 2
    if block_m >= 64:  # 64-128 rows at D128: one stage at every loop measured (14-67 blocks)
        return n_blk, n_blk, 1
    return 24, 40, fit  # up to 32 rows


def launch_config(B: int, Hq: int, Hkv: int, Lq: int, D: int, dtype: torch.dtype, capacity: int,
                  n_sink: int | None, window: int | None, sm_count: int | None,
                  num_splits: int | None = None, block_n: int | None = None,
                  num_warps: int | None = None, num_stages: int | None = None,
                  smem_bytes: int = SMEM_H200, q_tiles: int = 1) -> LaunchConfig:
    """The launch for a query tile over a cache of ``capacity`` positions, from shapes only (no sync).

    ``sm_count`` is the GPU's SM count, ``None`` for the CPU interpreter; ``smem_bytes`` its opt-in
    shared memory per block; ``num_splits``, ``block_n``, ``num_warps`` and ``num_stages`` override
    the defaults of NOTE [Launch] when given. ``q_tiles``: query tiles a program holds, 2 with
    re-indexed sinks' ``q_sink``: the compiled kernel stages the second one in shared memory too
    (scripts/kernel_sm90.py: +64 KiB at fp32, D256, 64 rows), so both tiles are counted beside the
    headroom (an H200 run found that launch 1.3 KB over with four stages).

    Raises:
        ValueError: for ``num_splits < 1``, a ``block_n`` that is not a power of two >= 16, or an
            empty cache.
    """
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be at least 1, got {num_splits}")
    if block_n is not None and (block_n < 16 or block_n & (block_n - 1)):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    if capacity < 1:
        raise ValueError("the cache holds no positions")
    fp64, fma = dtype == torch.float64, dtype in (torch.float32, torch.float64)  # fma: no bf16 tensor cores
    block_m = _next_pow2(max(16, Hq // Hkv * Lq))
    budget = min(200 * 1024, smem_bytes - SMEM_HEADROOM)  # bytes for pipelined K/V blocks (as tuned: one tile)
    if q_tiles > 1:
        budget = min(budget, smem_bytes - SMEM_HEADROOM - q_tiles * block_m * D * dtype.itemsize)
    n_keys = capacity if window is None else min(capacity, (n_sink or 0) + window + Lq - 1)  # upper bound
    short = sm_count is not None and not fma and _cdiv(n_keys, 64) * B * Hkv <= 8 * sm_count
    if block_n is None:  # a short range's one block of 64 keys, 32 where shared memory is smaller
        one = 64 if 2 * 64 * D * dtype.itemsize <= budget else 32
        block_n = one if short else (16 if D >= 128 else 32) if fma else 32 if D > 128 else 64
    n_blk = _cdiv(n_keys, block_n) + (window is not None)  # two ranges: one more partial block
    stage_bytes = 2 * block_n * D * dtype.itemsize  # one K block and one V block
    two_per_sm = block_m * D * (8 if fp64 else 4) <= 32 * 1024 and 2 * 3 * stage_bytes <= budget
    if num_splits is None:
        if sm_count is None:  # the CPU interpreter runs programs one by one: splitting only adds programs
            num_splits = 1
        elif short:  # one block a program, unless partials are heavy and fill 1.5 waves or more (NOTE [Launch])
            partial = Hq // Hkv * Lq * (D + 2) * 4  # bytes a split writes and the merge reads: m, l, acc of real rows
            per_sm = 2 if block_m * D * 4 <= 32 * 1024 else 1  # resident programs an SM, by accumulator size
            light = 32 * partial < 2 * block_n * D * dtype.itemsize  # under 1/32 of a block's K and V bytes
            programs, slots = n_blk * B * Hkv, per_sm * sm_count  # one-block programs; resident programs
            waves = programs // slots if programs >= 2 * slots else 2 if 2 * programs >= 3 * slots else 1
            num_splits = n_blk if light else _cdiv(n_blk, waves)
        else:  # whole waves: 1 or 2 resident programs per SM, by registers and shared memory
            num_splits = max(1, min(n_blk, (2 if two_per_sm else 1) * sm_count // (B * Hkv)))
        num_splits = _cdiv(n_blk, _cdiv(n_blk, num_splits))  # drop splits left empty
    if num_warps is None:
        acc = block_m * D * (2 if fp64 else 1)  # accumulator size (fp32 words)
        num_warps = 8 if acc > 128 * 128 or (short and acc > 16 * 256) else 4
    if num_stages is None:  # K/V blocks in flight per program, within the shared-memory budget
        fit = 3 if two_per_sm else max(1, min(4, budget // stage_bytes))
        extend = window is not None and 1 < Lq <= 32 and D >= 128 and not fma  # 2-32 queries (measured: 2-8, 16, 32)
        # a windowed tile's loop: one stage up to `one` blocks, two up to `two`, then `deep` (NOTE [Launch])
        one, two, deep = _extend_stages(block_m, D, n_blk, B * Hkv * num_splits, sm_count, fit)
        loop = _cdiv(n_blk, num_splits)
        num_stages = 1 if short or (extend and loop <= one) else min(2, fit) if extend and loop <= two else \
            min(deep, fit) if extend else fit
    return LaunchConfig(block_m, block_n, num_splits, num_warps, num_stages)


def check_tensors(q, k, v, q_pos) -> None:
    """The Triton kernels' input contract (``ValueError`` otherwise, as ``python -O`` keeps it): one
    device, one dtype of fp16/bf16/fp32/fp64, k and v alike, a power-of-two head dim in [16, 256],
    contiguous in it."""
    if not q.device == k.device == v.device == q_pos.device:
        raise ValueError("all tensors must be on one device")
    if not (q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)):
        raise ValueError(f"q, k, v must share one dtype of fp16/bf16/fp32/fp64, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or k.stride() != v.stride():
        raise ValueError("k and v must have one shape and one layout")
    D = q.shape[-1]
    if D not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {D}")
    if k.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("the head dimension must be contiguous")


def query_chunk(Lq: int, group: int, dtype: torch.dtype, D: int) -> int:
    """The queries one tile holds (NOTE [Chunks] in attention/triton_attention.py): all ``Lq``, or
    ``max_tile_rows(dtype, D) // group`` of them when the tile cannot hold every query of the group.

    Raises:
        ValueError: for a ``group`` of query heads a kv head larger than a tile.
    """
    max_rows = max_tile_rows(dtype, D)
    if group > max_rows:
        raise ValueError(f"{group} query heads per kv head exceed the kernel's tile of {max_rows} rows "
                         f"({dtype}, head_dim {D}); use impl='torch'")
    return max(1, min(Lq, max_rows // group))
