"""Split-K flash-decoding over the Windowed-MTP key set, in Triton (arXiv 2607.21535, Sec. 3).

One kernel serves the draft (``n_sink`` sinks + ``window`` recent keys) and the verify step
(``window=None``: full causal set), on a contiguous ``(B, Hkv, S, D)`` cache or a paged
``(num_pages, page_size, Hkv, D)`` cache with a block table. Keys are read in place: never
gathered, never copied.

Design (STYLE.md lesson 4):

- Grid ``(B * Hkv, n_splits)`` (axis 0 ``n_chunks * B * Hkv``: NOTE [Chunks]). A program owns one
  (batch, kv head) and holds the queries of all ``group = Hq // Hkv`` query heads of that kv head
  times all ``Lq`` queries as ONE tile of
  ``BLOCK_M = next_pow2(max(16, group * Lq))`` rows, so each key is loaded once for the group.
  Row ``r`` is (query head ``h = r // Lq``, query ``i = r % Lq``); rows ``r >= group * Lq`` are
  padding (their query is zero; they are never stored).
- The tile's keys are two ranges, the union of its queries' key sets (wmtp/keyset.py): the sinks
  ``[0, sink_end(t_max))`` and the recent range ``[recent_start(t_min), t_max + 1)``. Skipped
  keys are never iterated, so the draft's work is O(n_sink + window + Lq), independent of S.
- Per range, blocks of ``BLOCK_N`` keys that every query of the tile reads run UNMASKED; the
  others (the range's edges: the sink/window boundary, the causal diagonal, a partial last
  block) run MASKED with the key-set formula evaluated per row from that row's own ``q_pos``.
  Each range is three loops (masked, unmasked, masked) like the ``STAGE`` split of Triton's
  fused-attention tutorial.
- Split-K: the concatenated blocks of both ranges are cut into ``n_splits`` runs of whole
  blocks; each program writes partials ``(m, l, acc)`` of its real rows and the merge kernel
  (attention/triton_merge.py) combines them with log-sum-exp. With one
  split the attention kernel writes the output itself.
- Any ``q_pos`` is correct (masks use each row's own position); scattered positions only widen
  the recent range and mask more blocks. A tile holds at most ``max_tile_rows(dtype, D)`` rows
  (attention/plan.py: the accumulator must fit in registers); a longer query block is chunked
  (NOTE [Chunks]).

NOTE [Chunks]: a query block longer than one tile (a prefill, or group 16 x 16 queries at D >= 128)
is cut into ``n_chunks`` chunks of ``Lq = max_tile_rows // group`` queries (``query_chunk``), all in
ONE launch: grid axis 0 runs over (chunk, batch, kv head), each chunk's tile planned as a batch
row's (``launch_config`` with ``B * n_chunks`` rows), so a prefill of many chunks needs no split
and a verify of two keeps its splits. The kernel takes ``n_queries`` (the block's) beside ``Lq``
(a tile's); the last chunk's padding rows take its last query's position, load no query and are
never stored (nor merged). Chunk slot 0 holds the LAST chunk: under the causal set the latest
queries read the most keys, so they start first. One launch a layer instead of one a chunk: a
16K-token prompt of the small preset was 256 launches (and merges) a global layer.

NOTE [Host sync]: none. The launcher never reads a device tensor: the grid, ``n_splits``, tile
sizes and query chunks come from shapes and Python ints only, so a call is asynchronous and
CUDA-graph capturable. Each program loads the tile's positions, takes ``t_min``/``t_max`` and
computes on device what ``key_plan`` (attention/plan.py) computes on the host (the two ranges,
their blocks, the unmasked blocks, its share ``cdiv(n_blk, n_splits)`` of the blocks).
``window=None`` runs as ``n_sink = 0, window = FULL`` (2**30: caches hold at most that many positions).

NOTE [PDL]: with split-K the call is two dependent kernels. On sm_90+ the merge is launched with
programmatic dependent launch: every attention program calls ``gdc_launch_dependents`` first, so
the merge grid is scheduled while the attention grid runs, and its ``gdc_wait`` returns once the
attention grid has finished and its partials are visible: meant to hide the second launch, not
the dependency. Measured: 0.1-0.6 us off the draft's default launch (draft-floor-h200-{d011fa8,772f74a}.json).
A merge fused into this kernel (cooperative grid, arrival counter) was slower (metrics/experiments/).
The merge (attention/triton_merge.py) loads a chunk's m, l and acc together, up to 256 splits.

NOTE [Pages]: a paged launch reads each block's page ids from the block table, and K and V's
addresses wait for them. ``PAGED=2`` (a launch with pipeline stages: the verify) loads the next
block's page ids one iteration ahead, so no loop iteration waits for the table: on an H200, paged
verify at 1M keys +11-38 % faster (metrics/experiments/ab-h200-exp7-pages-ahead.json); ``PAGED=1``
(one stage: the draft, a block or two a program) loads them in the iteration, where loading ahead
cost 0.2-3.7 us. ``PAGED=0``: contiguous.

NOTE [Reads]: a MASKED block loads only the keys and values that some row of the tile reads
(``kread``; the block table is read for the whole range), so a cache row outside the union of the
key sets is never loaded, and NaN there cannot reach the output. (A NaN value row that one query
of the tile reads reaches every row of the tile through ``p @ V``, as in the reference's dense
runs of consecutive queries.)

NOTE [Offsets]: Triton passes an int argument below 2^31, and ``program_id``, as int32, so a
product of a head index and a stride wraps once a tensor passes 2^31 elements (8 kv heads of
4M keys at D128). Every offset into q, K, V or the block table that multiplies a stride is formed
in int64, but in the key loop. There a key's address is a pointer to its page (a paged cache:
``page * stride`` in the width ``OFF``) or to its position (contiguous: int64), plus 32-bit offsets
within it: its row of the page (the width ``ROW``) and the head dim. The plan picks ``OFF`` int32
unless the page pool's largest offset passes 2^31 - 1, ``ROW`` int32 unless a page's largest (row,
dim) offset does (attention/triton_plan.py, from shapes and strides). Side by side on an H200 at 1M
keys (metrics/experiments/offsets-h200-exp16.json), int32 pages made the paged ``q_len``-8 verify
17 % (D256) and 1 % (D128) faster and the paged ``q_len``-8 drafts 14 % / 10 % (speedups, old/new
- 1), while int32 positions moved the contiguous cells at most 1 % but for a 4 % loss (the D256
``q_len``-8 draft): contiguous launches keep int64. A pool past 2^31 elements (over 4 GiB of bf16
keys) needs int64 pages; where every element's offset was formed in 64 bits, a 64-bit pointer a
key and 32-bit offsets within its page took 0.4-5.2 % of the time off 11 of 12 paged cells with
int64 pages on an H100, one +1.3 %, and moved those with int32 pages by -3.1 to +2.7 %
(metrics/experiments/page-offsets-h100-exp63.json). int64 pages' stride is then a literal
(``PAGE_STRIDE``; 0, the argument's stride, for int32 pages and contiguous caches): as an argument,
its sign extension was hoisted out of the loop and each key's product compiled to a 64-bit multiply
(triton 3.7.1 offline: 257 ``mul.lo.s64`` in the batch-4 D128 draft's PTX, int32 pages' 1;
tests/test_kernel_sm90.py). On an H100 the literal took 5.0 / 2.1 % off that draft at 1M (``q_len``
1 / 8), 3.7 % off the D256 batch-8 verify, and moved the other three int64 cells by -0.2 to +0.5 %;
D128's int64 pages, forced on a 2^31 pool, came within 0.7 % of int32 ones (page-stride-h100-exp64.json
in metrics/experiments); on an H200 5.6 % off that one-query draft, 4.9 % off that verify, D128's
int64 pages within 0.8 % of int32 on a 2^31 pool (page-stride-h200-exp64.json). The output's offsets
(``_store_rows``, the merge) stay int32 within a batch for one tile of queries (at most Hkv x 256
tile rows x 256 head dims a batch, below 2^31 for any Hkv < 32768); with NOTE [Chunks] the query
and head terms are int64 (a 1M-token prefill's output passes 2^31 elements); the batch term is int64.
The head dim's offset is int32: the public ops refuse a cache whose last dim is strided
(``triton_refuses``).

NOTE [Re-indexed sinks]: with ``q_sink`` (``QSINK``) the sink range is scored by those queries
and the recent range by ``q``: re-indexed (StreamingLLM) positions, which move only the sinks'
distances (wmtp/keyset.py). The two ranges split the keys at ``n_sink`` exactly (``rec_lo >=
n_sink`` whenever a sink exists), so no key is scored by the wrong query. Without it ``q_s`` is
``q`` and ``QS`` is not read.

NOTE [Precision]: ``tl.dot`` accumulates in fp32 (fp64 for fp64 inputs, which the GPU
losslessness tests use: decode.py NOTE [Exactness]); softmax runs in the log2 domain
(``qk_scale = log2(e) / sqrt(D)``, computed in the kernel in the accumulator's dtype, ``exp2``).
fp64 inputs use ``input_precision="ieee"``, fp32 ``"ieee"`` or, for tiles at D <= 64 on a GPU,
``"tf32x3"`` (NOTE [tf32x3] in attention/triton_plan.py). fp16/bf16 use native tensor-core
dots; under the CPU interpreter, which cannot multiply bf16, bf16 tiles are upcast to fp32 after
loading (``UPCAST``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import CachedLaunch, fast_launches
from .plan import check_tensors
from .triton_merge import _tile_rows, launch_merge, merge_splits  # noqa: F401  (merge_splits: re-exported)
from .triton_plan import FULL, KernelCall, _gpu_limits, plan_call  # noqa: F401  (FULL, KernelCall: re-exported)

__all__ = ["attention_triton", "paged_attention_triton"]


@triton.jit
def _attend(acc, m_i, l_i, q, t,  # running (BLOCK_M, D) sum, (BLOCK_M,) max/denominator (ACC dtype); q tile; positions
            k_base, v_base,  # pointers to the (batch, kv head) of K / V (contiguous) or to head kvh of page 0 (paged)
            bt_row,  # pointer to the block-table row of this sequence (paged only)
            stride_outer, stride_pos, stride_d,  # K/V strides: batch or page, position or page row, head dim
            lo, hi, blk_a, blk_b,  # range [lo, hi) of key positions; this loop runs its blocks [blk_a, blk_b)
            n_sink, window, qk_scale,  # qk_scale: a scalar of the accumulator's dtype
            BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr,
            MASKED: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, OFF: tl.constexpr,
            ROW: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if PAGED == 2:  # NOTE [Pages]: the first block's pages; each iteration loads the next block's
        nxt = lo + blk_a * BLOCK_N + offs_n  # (BLOCK_N,)
        page_next = tl.load(bt_row + nxt // PAGE_SIZE, mask=nxt < hi, other=0)  # (BLOCK_N,)
    for blk in range(blk_a, blk_b):
        kpos = lo + blk * BLOCK_N + offs_n  # (BLOCK_N,) key positions
        if MASKED:  # THE key-set formula (wmtp/keyset.py), per row, plus the range bound
            kp = kpos[None, :]
            tt = t[:, None]
            allowed = (kp <= tt) & ((kp < n_sink) | (kp > tt - window)) & (kp < hi)  # (BLOCK_M, BLOCK_N)
            kread = tl.max(allowed.to(tl.int32), axis=0) > 0  # (BLOCK_N,) keys some row reads
        if PAGED:  # position p lives at page block_table[p // PAGE_SIZE], row p % PAGE_SIZE
            if PAGED == 2:  # (the block-table mask is the range, not kread: triton 3.6 fails to compile that)
                page, nxt = page_next, kpos + BLOCK_N
                page_next = tl.load(bt_row + nxt // PAGE_SIZE, mask=nxt < hi, other=0)  # (BLOCK_N,)
            elif MASKED:
                page = tl.load(bt_row + kpos // PAGE_SIZE, mask=kpos < hi, other=0)  # (BLOCK_N,)
            else:
                page = tl.load(bt_row + kpos // PAGE_SIZE)  # (BLOCK_N,)
            k_row = k_base + page.to(OFF) * stride_outer  # (BLOCK_N,) to each key's page: NOTE [Offsets]
            v_row = v_base + page.to(OFF) * stride_outer
            in_page = (kpos % PAGE_SIZE).to(ROW) * stride_pos  # (BLOCK_N,) the key's row in its page
        else:
            k_row = k_base + kpos.to(OFF) * stride_pos  # (BLOCK_N,) NOTE [Offsets]
            v_row = v_base + kpos.to(OFF) * stride_pos
            in_page = tl.zeros_like(offs_n)  # (BLOCK_N,) int32
        if MASKED:  # K and V are both loaded before any arithmetic: two memory round trips overlap
            k = tl.load(k_row[None, :] + (in_page[None, :] + offs_d[:, None] * stride_d), mask=kread[None, :],
                        other=0.0)
            v = tl.load(v_row[:, None] + (in_page[:, None] + offs_d[None, :] * stride_d), mask=kread[:, None],
                        other=0.0)
        else:
            k = tl.load(k_row[None, :] + (in_page[None, :] + offs_d[:, None] * stride_d))  # (D, BLOCK_N)
            v = tl.load(v_row[:, None] + (in_page[:, None] + offs_d[None, :] * stride_d))  # (BLOCK_N, D)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N), log2 domain
        if MASKED:
            s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: avoid -inf - -inf
        p = tl.math.exp2(s - m_use[:, None])  # (BLOCK_M, BLOCK_N)
        alpha = tl.math.exp2(m_i - m_use)  # (BLOCK_M,)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION, out_dtype=acc.dtype)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attend_range(acc, m_i, l_i, q, t, k_base, v_base, bt_row, stride_outer, stride_pos, stride_d,
                  lo, hi, a, b, u1, u2,  # range [lo, hi); this split's blocks [a, b); unmasked blocks [u1, u2)
                  n_sink, window, qk_scale,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr,
                  UPCAST: tl.constexpr, PRECISION: tl.constexpr, OFF: tl.constexpr, ROW: tl.constexpr):
    u1 = tl.minimum(tl.maximum(u1, a), b)
    u2 = tl.minimum(tl.maximum(u2, u1), b)
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, t, k_base, v_base, bt_row, stride_outer, stride_pos, stride_d,
                            lo, hi, a, u1, n_sink, window, qk_scale,  # masked head
                            BLOCK_N, HEAD_DIM, PAGE_SIZE, PAGED, True, UPCAST, PRECISION, OFF, ROW)
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, t, k_base, v_base, bt_row, stride_outer, stride_pos, stride_d,
                            lo, hi, u1, u2, n_sink, window, qk_scale,  # unmasked interior
                            BLOCK_N, HEAD_DIM, PAGE_SIZE, PAGED, False, UPCAST, PRECISION, OFF, ROW)
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, t, k_base, v_base, bt_row, stride_outer, stride_pos, stride_d,
                            lo, hi, u2, b, n_sink, window, qk_scale,  # masked tail
                            BLOCK_N, HEAD_DIM, PAGE_SIZE, PAGED, True, UPCAST, PRECISION, OFF, ROW)
    return acc, m_i, l_i


@triton.jit
def _key_plan(t_min, t_max, n_sink, window, BLOCK_N: tl.constexpr):
    """``key_plan`` on device (elementwise; sink_u1 is always 0). window=None runs as n_sink=0, window=FULL."""
    rec_hi = t_max + 1  # union of the key sets of [t_min, t_max]: sinks [0, sink_hi), recent [rec_lo, rec_hi)
    sink_hi = tl.minimum(n_sink, rec_hi)
    rec_lo = tl.minimum(tl.maximum(tl.maximum(n_sink, t_min - window + 1), sink_hi), rec_hi)
    n_blk_sink = tl.cdiv(sink_hi, BLOCK_N)  # unmasked blocks lie in the intersection of the key sets:
    sink_u2 = tl.minimum(n_sink, t_min + 1) // BLOCK_N  # sinks [0, min(n_sink, t_min + 1)) and
    n_blk_rec = tl.cdiv(rec_hi - rec_lo, BLOCK_N)  # recent [max(n_sink, t_max - window + 1), t_min + 1)
    rec_u1 = tl.minimum(tl.cdiv(tl.maximum(tl.maximum(n_sink, t_max - window + 1) - rec_lo, 0), BLOCK_N), n_blk_rec)
    rec_u2 = tl.minimum(tl.maximum(rec_u1, tl.maximum(t_min + 1 - rec_lo, 0) // BLOCK_N), n_blk_rec)
    return sink_hi, n_blk_sink, sink_u2, rec_lo, rec_hi, n_blk_rec, rec_u1, rec_u2


@triton.jit
def _store_rows(Out, tile, rows, qi, real, b, kvh, Lq,  # tile (R, D) accumulator; rows, qi, real (R,): _tile_rows'
                stride_ob, stride_oh, stride_ol, stride_od, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    head = (kvh * GROUP + rows // Lq).to(qi.dtype)  # (R,) int64 with NOTE [Chunks]: a head-major output's stride
    row_off = b.to(tl.int64) * stride_ob + head * stride_oh + qi * stride_ol  # (R,)
    ptrs = Out + row_off[:, None] + offs_d[None, :] * stride_od  # (R, D)
    tl.store(ptrs, tile.to(Out.dtype.element_ty), mask=real[:, None])


@triton.jit
def _attention_kernel(
    Q,  # (B, Hq, n_queries, D) queries, any strides (n_queries is Lq unless CHUNKED)
    QS,  # (B, Hq, n_queries, D) queries that score the sinks, Q's strides (QSINK only; any tensor otherwise)
    K, V,  # contiguous: (B, Hkv, S, D); paged: (num_pages, PAGE_SIZE, Hkv, D); same strides for K and V
    BT,  # (B, max_pages) int32 block table (paged only; any tensor otherwise)
    QPOS,  # (n_queries,) absolute query positions (int64), or (B, n_queries): each row's, stride_pb apart
    Out,  # (B, Hq, n_queries, D) output in q.dtype (written when n_splits == 1)
    WS,  # partials (accumulator dtype), one flat workspace: m, l (n_rows each) and acc (n_rows * D); NOTE [Workspace]
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kouter, stride_kpos, stride_kh, stride_kd,  # batch|page, position|page row, kv head, head dim
    stride_btb,
    stride_pb,  # QPOS's batch stride: 0 when every row shares the positions
    stride_ob, stride_oh, stride_ol, stride_od,
    Hkv, Lq, capacity, n_sink, window, n_splits,  # Lq: a tile's queries; capacity: the cache's key positions
    n_rows,  # n_chunks * B * Hkv * n_splits * BLOCK_M: partial rows in WS
    n_queries,  # the call's queries: Lq, or with CHUNKED more, in chunks of Lq (NOTE [Chunks])
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr,  # PAGED: 0, 1, 2
    PRECISION: tl.constexpr, ACC: tl.constexpr,  # ACC: accumulator dtype, float64 for float64 inputs
    OFF: tl.constexpr,  # NOTE [Offsets]: the key loop's page (or position) offsets, int32 (a paged pool below 2^31)
    ROW: tl.constexpr,  # NOTE [Offsets]: offsets within a page, int32 unless its (row, dim) offsets pass 2^31 - 1
    PAGE_STRIDE: tl.constexpr,  # NOTE [Offsets]: int64 pages' stride as a literal (0: K's page stride, an argument)
    PDL: tl.constexpr,  # NOTE [PDL]: let the merge kernel launch now; it waits for this grid's end
    QSINK: tl.constexpr,  # NOTE [Re-indexed sinks]: the sink range is scored by QS, not Q
    CHUNKED: tl.constexpr,  # NOTE [Chunks]: grid axis 0 also runs over chunks of Lq queries
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    qk_scale = tl.full([], 1.4426950408889634, ACC) / tl.sqrt(tl.full([], HEAD_DIM, ACC))  # log2(e) / sqrt(D)
    rows = tl.arange(0, BLOCK_M)  # row r = (query head r // Lq, query qi[r]: r % Lq of the tile's chunk)
    bh, qi, real = _tile_rows(pid_bh, rows, Lq, n_queries, GROUP, CHUNKED)  # (BLOCK_M,) qi, real
    b = bh // Hkv
    kvh = bh % Hkv
    offs_d = tl.arange(0, HEAD_DIM)
    q_row = (b.to(tl.int64) * stride_qb + (kvh * GROUP + rows // Lq).to(tl.int64) * stride_qh
             + qi.to(tl.int64) * stride_ql)  # (BLOCK_M,) NOTE [Offsets]
    q = tl.load(Q + q_row[:, None] + offs_d[None, :] * stride_qd, mask=real[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_s = q
    if QSINK:  # NOTE [Re-indexed sinks]
        q_s = tl.load(QS + q_row[:, None] + offs_d[None, :] * stride_qd, mask=real[:, None], other=0.0)
        if UPCAST:
            q_s = q_s.to(tl.float32)
    # (BLOCK_M,) padding rows repeat a real query's position. NOTE [Host sync]: positions are not
    # checked on the host; clamped to [0, capacity) (before the int32 cast) so that no read leaves the cache
    t = tl.minimum(tl.maximum(tl.load(QPOS + b.to(tl.int64) * stride_pb + qi), 0), capacity - 1).to(tl.int32)

    sink_hi, n_blk_sink, sink_u2, rec_lo, rec_hi, n_blk_rec, rec_u1, rec_u2 = _key_plan(
        tl.min(t, 0), tl.max(t, 0), n_sink, window, BLOCK_N)  # NOTE [Host sync]: planned on device
    blocks_per_split = tl.cdiv(n_blk_sink + n_blk_rec, n_splits)

    if PAGED:
        stride_kouter = stride_kouter if PAGE_STRIDE == 0 else PAGE_STRIDE  # NOTE [Offsets]
        k_base = K + kvh.to(tl.int64) * stride_kh  # NOTE [Offsets]
        v_base = V + kvh.to(tl.int64) * stride_kh
        bt_row = BT + b.to(tl.int64) * stride_btb
    else:
        k_base = K + b.to(tl.int64) * stride_kouter + kvh.to(tl.int64) * stride_kh  # NOTE [Offsets]
        v_base = V + b.to(tl.int64) * stride_kouter + kvh.to(tl.int64) * stride_kh
        bt_row = BT

    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], ACC)
    # this split's blocks [start, end) of the concatenation (sink blocks, recent blocks)
    start = pid_s * blocks_per_split
    end = start + blocks_per_split
    acc, m_i, l_i = _attend_range(acc, m_i, l_i, q_s, t, k_base, v_base, bt_row, stride_kouter, stride_kpos, stride_kd,
                                  0, sink_hi, tl.minimum(start, n_blk_sink), tl.minimum(end, n_blk_sink),
                                  0, sink_u2, n_sink, window, qk_scale,
                                  BLOCK_N, HEAD_DIM, PAGE_SIZE, PAGED, UPCAST, PRECISION, OFF, ROW)
    acc, m_i, l_i = _attend_range(acc, m_i, l_i, q, t, k_base, v_base, bt_row, stride_kouter, stride_kpos, stride_kd,
                                  rec_lo, rec_hi, tl.maximum(start - n_blk_sink, 0),
                                  tl.minimum(tl.maximum(end - n_blk_sink, 0), n_blk_rec),
                                  rec_u1, rec_u2, n_sink, window, qk_scale,
                                  BLOCK_N, HEAD_DIM, PAGE_SIZE, PAGED, UPCAST, PRECISION, OFF, ROW)

    if SPLIT:  # partials of this split's real rows; a split without keys stores m = -inf, l = 0, acc = 0
        part = (pid_bh.to(tl.int64) * n_splits + pid_s) * BLOCK_M + rows  # (BLOCK_M,) int64: may pass 2^31 * D
        tl.store(WS + part, m_i, mask=real)  # m: (grid axis 0, n_splits, BLOCK_M)
        tl.store(WS + n_rows + part, l_i, mask=real)  # l: the same shape, after m
        tl.store(WS + n_rows + n_rows + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=real[:, None])  # acc
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        _store_rows(Out, out, rows, qi, real, b, kvh, Lq, stride_ob, stride_oh, stride_ol, stride_od, GROUP,
                    HEAD_DIM)


_ATTENTION = CachedLaunch(_attention_kernel)  # NOTE [Launch cache] in attention/launch.py
KEYED = 6  # the launch cache keys the caller's tensors q, qs, k, v, bt, q_pos; out, ws: plan_call's (NOTE [Workspace])
MERGE_KEYED = 0  # the merge's ws and out are plan_call's; its static key holds their dtypes


def _launch(q, q_sink, k, v, block_table, page_size, q_pos, n_sink, window, tuning):
    """Run the kernels for one block of queries (``plan_call`` plans them for q's device)."""
    if q.device.type == "cuda" and q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):  # Triton launches on the current device (and its stream)
            return _launch(q, q_sink, k, v, block_table, page_size, q_pos, n_sink, window, tuning)
    limits = _gpu_limits(q.device) if q.device.type == "cuda" else None
    call = plan_call(q, k, v, block_table, page_size, q_pos, n_sink, window, tuning, limits, q_sink)
    if fast_launches(q.device):
        _ATTENTION.launch(call.grid, call.args, call.kwargs, call.static, 8, keyed=KEYED)
    else:
        _attention_kernel[call.grid](*call.args, **call.kwargs)
    if call.merge is not None:
        launch_merge(call.merge, keyed=MERGE_KEYED)
    return call.out


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                     n_sink: int | None = None, window: int | None = None, *,
                     num_splits: int | None = None, block_n: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None,
                     pdl: bool | None = None, q_sink: torch.Tensor | None = None) -> torch.Tensor:
    """Sink+window (or full causal) attention over a contiguous cache; semantics of ``attention_torch``.

    Args:
        q: ``(B, Hq, Lq, D)`` queries (fp16, bf16, fp32 or fp64, k's and v's; ``D`` a power of two,
            16..256; ``Hq // Hkv`` at most ``max_tile_rows(dtype, D)``; else ``ValueError``).
        k, v: ``(B, Hkv, S, D)`` position-indexed keys and values, any strides (head dim contiguous);
            ``S`` at most ``FULL`` = 2**30 (the kernel's positions are int32), else ``ValueError``.
        q_pos: ``(Lq,)`` LongTensor of absolute query positions, each in ``[0, S)`` (not checked here,
            which would need a host sync; the kernel clamps them to ``[0, S)``, so it never reads outside),
            or ``(B, Lq)``: each batch row's own (a program serves one row: the key ranges are its own).
        n_sink: sink keys (``None`` = 0).
        window: recent keys including the query's own (``None`` = full causal set).
        num_splits: split-K programs per (batch, kv head) and chunk of queries (NOTE [Chunks]; the
            workspace holds every chunk's partials: ``n_chunks * B * Hkv * BLOCK_M * (D + 2)``
            floats a split, ``BLOCK_M`` the tile's ``group * chunk`` rows padded to a power of
            two, at least 16; NOTE [Workspace]); ``None`` picks from the SM count, a prefill of many
            chunks one split.
        block_n: keys per block (tests use small blocks); ``None`` picks from ``D``.
        num_warps, num_stages: Triton launch options; ``None`` picks (scripts/tune_attention.py tunes them).
        pdl: launch the split merge with programmatic dependent launch (NOTE [PDL]); ``None`` = where
            the GPU has it (compute capability >= 9); ``True`` without it (an older GPU, the CPU
            interpreter) is a ``ValueError``.
        q_sink: queries that score the sink keys (NOTE [Re-indexed sinks]), q's shape, dtype and strides.

    Returns:
        ``(B, Hq, Lq, D)`` in ``q.dtype``.
    """
    check_tensors(q, k, v, q_pos)
    assert q_sink is None or q_sink.stride() == q.stride(), "q_sink: q's strides (the kernel offsets both alike)"
    q_pos = q_pos.contiguous()  # the kernel reads positions as one contiguous row (a no-op when they are)
    tuning = (num_splits, block_n, num_warps, num_stages, pdl)

    if not q.shape[2]:
        return torch.empty_like(q)
    return _launch(q, q_sink, k, v, None, 1, q_pos, n_sink, window, tuning)


def paged_attention_triton(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           block_table: torch.Tensor, q_pos: torch.Tensor,
                           n_sink: int | None = None, window: int | None = None, *,
                           num_splits: int | None = None, block_n: int | None = None,
                           num_warps: int | None = None, num_stages: int | None = None,
                           pdl: bool | None = None, q_sink: torch.Tensor | None = None) -> torch.Tensor:
    """Sink+window (or full causal) attention over a paged cache, read in place through the block table.

    Args:
        q: ``(B, Hq, Lq, D)`` queries.
        k_pages, v_pages: ``(num_pages, page_size, Hkv, D)``; position ``p`` of sequence ``b`` is
            row ``p % page_size`` of page ``block_table[b, p // page_size]``.
        block_table: ``(B, max_pages)`` int32 (``max_pages * page_size`` at most 2**30 positions, as
            ``attention_triton``'s ``S``), each page a read key lives on in ``[0, num_pages)``
            (not checked: that needs a host sync; a page id outside it reads outside the pool or, its
            offset wrapped in int32, another page).
        q_pos, n_sink, window, num_splits, block_n, num_warps, num_stages, pdl, q_sink: as in
            ``attention_triton``.

    Returns:
        ``(B, Hq, Lq, D)`` in ``q.dtype``.
    """
    check_tensors(q, k_pages, v_pages, q_pos)
    assert q_sink is None or q_sink.stride() == q.stride(), "q_sink: q's strides (the kernel offsets both alike)"
    assert block_table.dtype == torch.int32 and block_table.device == q.device, "block_table: int32 on q's device"
    q_pos, block_table = q_pos.contiguous(), block_table.contiguous()  # read as contiguous rows by the kernel
    tuning = (num_splits, block_n, num_warps, num_stages, pdl)

    if not q.shape[2]:
        return torch.empty_like(q)
    return _launch(q, q_sink, k_pages, v_pages, block_table, k_pages.shape[1], q_pos, n_sink, window, tuning)
