"""The Triton split-K kernel against the PyTorch reference, contiguous and paged caches.

One parametrized test runs ``impl in {torch, triton}`` through the public ops (``wmtp.attention``,
``paged_attention``) against the float64 ground truth of tests/attention_truth.py, with its kernel tolerance rule
(NOTE [Tolerances] there: at most twice the low-precision reference's own error plus a floor).
Without CUDA, Triton runs under its CPU interpreter (tests/conftest.py sets TRITON_INTERPRET=1),
which costs about a millisecond per program-iteration: the CPU grid is small and chosen, the big
grid (head_dim 128/256, more head layouts, bfloat16, long caches) runs only on CUDA.
"""

import os
import random

import pytest
import torch
import triton
import triton.language as tl
from attention_truth import assert_kernel_close, dtype_id, make_inputs

import wmtp
from wmtp.attention import paged_attention, resolve_impl
from wmtp.attention.paged import paginate
from wmtp.attention.triton_attention import _key_plan
from wmtp.keyset import draft_key_mask

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TRITON = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
NEEDS_TRITON = pytest.mark.skipif(not TRITON, reason="Triton needs CUDA or its CPU interpreter (TRITON_INTERPRET=1)")
CUDA_ONLY = pytest.mark.skipif(not CUDA, reason="CUDA only: keeps the CPU-interpreter run of this file short")

DTYPES = [torch.float32, torch.float16, torch.float64] + [pytest.param(torch.bfloat16, marks=CUDA_ONLY)]
LAYOUTS = ["contiguous", "paged1", "paged16"]  # paged<N>: pages of N positions, randomly permuted


def _run(impl, layout, q, k, v, q_pos, n_sink, window, **kwargs):
    """The op under test: ``attention`` on the contiguous cache, or ``paged_attention`` on a paged copy."""
    if layout == "contiguous":
        if kwargs:
            from wmtp.attention.triton_attention import attention_triton
            return attention_triton(q, k, v, q_pos, n_sink, window, **kwargs)
        return wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl=impl)
    gen = torch.Generator().manual_seed(q.shape[-1] + k.shape[2])
    k_pages, v_pages, block_table = paginate(k, v, int(layout.removeprefix("paged")), gen)
    if kwargs:
        from wmtp.attention.triton_attention import paged_attention_triton
        return paged_attention_triton(q, k_pages, v_pages, block_table, q_pos, n_sink, window, **kwargs)
    return paged_attention(q, k_pages, v_pages, block_table, q_pos, n_sink=n_sink, window=window, impl=impl)


# (B, Hq, Hkv, Lq, S, D, n_sink, window); queries at the last Lq positions of the cache.
SHAPES = [
    pytest.param(2, 1, 1, 1, 37, 32, 4, 8, id="decode-S37"),
    pytest.param(1, 4, 1, 8, 100, 64, 4, 16, id="verify-S100-gqa4"),
    pytest.param(1, 8, 2, 8, 133, 32, None, None, id="verify-S133-full"),
    pytest.param(1, 8, 2, 1, 133, 64, None, None, id="decode-S133-full"),
    pytest.param(1, 8, 2, 1, 133, 32, 4, 80, id="decode-S133-window80"),
    pytest.param(1, 4, 1, 8, 19, 32, 4, 16, id="verify-S=ns+w-1"),
    pytest.param(1, 4, 1, 8, 20, 32, 4, 16, id="verify-S=ns+w"),
    pytest.param(1, 4, 1, 1, 21, 32, 4, 16, id="decode-S=ns+w+1"),
    pytest.param(1, 1, 1, 8, 100, 32, 0, 16, id="verify-nosink"),
    pytest.param(1, 4, 1, 8, 37, 32, 2, 1, id="verify-window1"),
    pytest.param(1, 4, 1, 8, 37, 32, 40, 4, id="verify-n_sink>S"),
    pytest.param(1, 4, 1, 100, 100, 32, 4, 16, id="prefill-L100-chunked"),  # 400 rows > 256: 2 chunks, one launch
    pytest.param(1, 4, 4, 8, 300, 128, 4, 64, id="verify-D128-mha", marks=CUDA_ONLY),
    pytest.param(2, 8, 8, 1, 1000, 256, 4, 256, id="decode-D256-mha", marks=CUDA_ONLY),
    pytest.param(1, 8, 2, 16, 1000, 256, None, None, id="verify-D256-Lq16", marks=CUDA_ONLY),
    pytest.param(2, 16, 1, 16, 4161, 128, 64, 4096, id="verify-group16-S=ns+w+1", marks=CUDA_ONLY),
    pytest.param(1, 32, 8, 4, 20000, 128, 64, 4096, id="draft-S20000", marks=CUDA_ONLY),
    pytest.param(1, 32, 8, 9, 20000, 128, None, None, id="verify-S20000-full", marks=CUDA_ONLY),
    pytest.param(1, 4, 1, 300, 300, 64, 4, 32, id="prefill-L300-chunked", marks=CUDA_ONLY),
]


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=NEEDS_TRITON)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("B, Hq, Hkv, Lq, S, D, n_sink, window", SHAPES)
def test_matches_float64_truth(B, Hq, Hkv, Lq, S, D, n_sink, window, dtype, layout, impl):
    q, k, v, q_pos = make_inputs(B, Hq, Hkv, Lq, S, D, dtype, seed=S + Lq + D, device=DEVICE)
    out = _run(impl, layout, q, k, v, q_pos, n_sink, window)
    assert_kernel_close(out, q, k, v, q_pos, n_sink, window)


# (Lq, S, n_sink, window, q_pos or None for the last Lq positions)
NAN_CASES = [
    pytest.param(1, 133, 4, 16, None, id="decode-S133"),
    pytest.param(8, 100, 0, 8, None, id="verify-nosink"),
    pytest.param(8, 100, 2, 1, None, id="verify-window1"),
    pytest.param(4, 300, 4, 8, [50, 51, 52, 53], id="verify-mid-cache"),
    pytest.param(8, 300, None, None, list(range(90, 98)), id="verify-full-mid-cache"),
    pytest.param(3, 300, 4, 8, [40, 150, 290], id="scattered-queries"),
    pytest.param(1, 40, 64, 8, [30], id="decode-inside-the-sinks"),  # t + 1 < n_sink: its block of 32 keys masked
]


@NEEDS_TRITON
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
@pytest.mark.parametrize("Lq, S, n_sink, window, positions", NAN_CASES)
def test_reads_only_the_key_set(Lq, S, n_sink, window, positions, layout):
    """NaN at every cache position outside the union of the key sets must not reach the output."""
    q, k, v, q_pos = make_inputs(2, 4, 2, Lq, S, 32, torch.float32, seed=11, q_pos=positions, device=DEVICE)
    outside = ~draft_key_mask(q_pos.cpu(), S, n_sink, window).any(dim=0).to(DEVICE)  # (S,)
    assert outside.any()  # the case must actually poison something
    k_nan, v_nan = k.masked_fill(outside[:, None], float("nan")), v.masked_fill(outside[:, None], float("nan"))
    out = _run("triton", layout, q, k_nan, v_nan, q_pos, n_sink, window)
    assert torch.isfinite(out).all(), f"NaN leaked into queries {(~torch.isfinite(out)).any(-1).nonzero().tolist()}"
    assert_kernel_close(out, q, k, v, q_pos, n_sink, window)


# (B, Hq, Hkv, Lq, D, n_sink, window): rows at positions 3.., S/2.. and the cache's last Lq
ROW_CASES = [
    pytest.param(3, 4, 2, 4, 32, 4, 16, id="draft-extend"),
    pytest.param(3, 4, 1, 8, 32, None, None, id="verify-full"),
    pytest.param(2, 2, 2, 1, 64, 2, 8, id="decode"),
    pytest.param(2, 4, 1, 100, 32, 4, 16, id="prefill-chunked"),  # 400 rows a kv head: 2 chunks a row, one launch
]


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=NEEDS_TRITON)])
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
@pytest.mark.parametrize("B, Hq, Hkv, Lq, D, n_sink, window", ROW_CASES)
def test_positions_per_row(B, Hq, Hkv, Lq, D, n_sink, window, layout, impl):
    """``q_pos`` ``(B, Lq)``: every batch row at its own positions, far apart (a row near the cache's
    start reads few keys, one at its end many). Each row is the op on that row alone at its positions
    (the reference's bit for bit), within the kernel rule of truth, and NaN outside a row's own key
    sets (in that row's cache) does not reach its output."""
    S = 300
    q, k, v, _ = make_inputs(B, Hq, Hkv, Lq, S, D, torch.float32, seed=Lq + D, device=DEVICE)
    q_pos = torch.stack([torch.arange(s, s + Lq) for s in (3, S // 2, S - Lq)[:B]]).to(DEVICE)  # (B, Lq)
    outside = torch.stack([~draft_key_mask(p.cpu(), S, n_sink, window).any(dim=0) for p in q_pos]).to(DEVICE)  # (B, S)
    assert outside[0].any()  # the first row reads few of its keys: the rest are poisoned
    poison = outside[:, None, :, None]  # (B, 1, S, 1)
    out = _run(impl, layout, q, k.masked_fill(poison, float("nan")), v.masked_fill(poison, float("nan")), q_pos,
               n_sink, window)
    assert torch.isfinite(out).all() and out.shape == q.shape
    for b in range(B):
        alone = _run(impl, layout, q[b : b + 1], k[b : b + 1], v[b : b + 1], q_pos[b], n_sink, window)
        assert impl == "triton" or torch.equal(out[b : b + 1], alone)
        assert_kernel_close(out[b : b + 1], q[b : b + 1], k[b : b + 1], v[b : b + 1], q_pos[b], n_sink, window)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=NEEDS_TRITON)])
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_positions_per_row_with_reindexed_sinks(layout, impl):
    """``q_pos`` ``(B, Lq)`` with ``q_sink`` (re-indexed positions: the sinks scored by other
    queries), queries chunked (Lq 70 x group 4 > a tile): each row within the kernel rule of truth."""
    B, Hq, Hkv, Lq, S, n_sink, window = 2, 4, 1, 70, 200, 4, 16
    q, k, v, _ = make_inputs(B, Hq, Hkv, Lq, S, 32, torch.float32, seed=21, device=DEVICE)
    q_sink = torch.randn(q.shape, generator=torch.Generator().manual_seed(22)).to(DEVICE)
    q_pos = torch.stack([torch.arange(10, 10 + Lq), torch.arange(S - Lq, S)]).to(DEVICE)  # (B, Lq)
    if layout == "contiguous":
        out = wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl=impl, q_sink=q_sink)
    else:
        k_pages, v_pages, table = paginate(k, v, 16, torch.Generator().manual_seed(23))
        out = paged_attention(q, k_pages, v_pages, table, q_pos, n_sink, window, impl=impl, q_sink=q_sink)
    for b in range(B):
        rows = slice(b, b + 1)
        assert_kernel_close(out[rows], q[rows], k[rows], v[rows], q_pos[b], n_sink, window, q_sink[rows])


# (B, Hq, Hkv, Lq, S, n_sink, window, dtype, layout)
SPLIT_CASES = [
    pytest.param(1, 8, 2, 8, 133, 4, 40, torch.float32, "contiguous", id="verify-window"),
    pytest.param(2, 4, 1, 1, 133, None, None, torch.float16, "paged16", id="decode-full-paged"),
    pytest.param(1, 4, 2, 4, 100, 0, 50, torch.bfloat16, "paged1", id="verify-nosink-bf16"),
    pytest.param(1, 4, 2, 3, 90, 2, 30, torch.float64, "contiguous", id="verify-fp64"),  # fp64 partials + merge
]


@NEEDS_TRITON
@pytest.mark.parametrize("num_stages", [1, 2])  # paged: page ids in the iteration, or a block ahead (NOTE [Pages])
@pytest.mark.parametrize("num_splits", [1, 3, 16])  # 16 > the key blocks: some splits get no keys
@pytest.mark.parametrize("B, Hq, Hkv, Lq, S, n_sink, window, dtype, layout", SPLIT_CASES)
def test_split_k(B, Hq, Hkv, Lq, S, n_sink, window, dtype, layout, num_splits, num_stages):
    """Split-K with small key blocks (masked and unmasked blocks in both ranges), empty splits included;
    the output in a query's-heads-side-by-side layout (NOTE [Output layout]), written by the kernel
    (one split) or by the merge."""
    q, k, v, q_pos = make_inputs(B, Hq, Hkv, Lq, S, 32, dtype, seed=5, device=DEVICE)
    out = _run("triton", layout, q, k, v, q_pos, n_sink, window, num_splits=num_splits, block_n=16,
               num_stages=num_stages)
    assert_kernel_close(out, q, k, v, q_pos, n_sink, window)
    assert out.shape == q.shape and out.transpose(1, 2).is_contiguous()


@NEEDS_TRITON
@pytest.mark.parametrize("num_stages", [1, 2])  # page ids in the iteration, or a block ahead (NOTE [Pages])
def test_pages_of_a_size_that_is_not_a_power_of_two(num_stages):
    """Position p is row ``p % page_size`` of page ``block_table[p // page_size]`` for any page size (the
    paged caches take any, tests/test_pagedcache.py): pages of 3 positions straddle the 16-key blocks."""
    q, k, v, q_pos = make_inputs(2, 4, 2, 3, 50, 32, torch.float32, seed=10, device=DEVICE)
    out = _run("triton", "paged3", q, k, v, q_pos, 4, 16, num_splits=2, block_n=16, num_stages=num_stages)
    assert_kernel_close(out, q, k, v, q_pos, 4, 16)


@NEEDS_TRITON
@pytest.mark.parametrize("num_splits", [1, 3])
def test_both_output_layouts_hold_the_same_bits(num_splits, monkeypatch):
    """NOTE [Output layout]: the head-major layout of the code before (``TOKEN_MAJOR = False``, in the
    static key) and the token-major one differ only in where each row is stored."""
    from wmtp.attention import triton_plan

    q, k, v, q_pos = make_inputs(1, 4, 2, 3, 90, 32, torch.float32, seed=6, device=DEVICE)
    outs = []
    for token_major in (True, False):
        monkeypatch.setattr(triton_plan, "TOKEN_MAJOR", token_major)
        outs.append(_run("triton", "contiguous", q, k, v, q_pos, 2, 30, num_splits=num_splits, block_n=16))
    assert outs[0].transpose(1, 2).is_contiguous() and outs[1].is_contiguous() and torch.equal(outs[0], outs[1])


@NEEDS_TRITON
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B, n_splits, max_chunk, D", [
    (2, 5, 2, 32),  # 3 chunks of 2 splits (the last half empty), the first chunk without keys
    (1, 7, 2, 32),  # 4 chunks of 2: keys in the last three, whose maxima rescale the running sums
    (1, 130, 256, 64),  # one chunk of 256, head dim cut into 4 slices of 16
])
def test_merge_matches_logsumexp(B, n_splits, max_chunk, D, dtype):
    """The split merge against log-sum-exp in torch: online over chunks, sliced over the head dim,
    empty splits (m = -inf, l = 0) weigh nothing and a row with no keys at all comes out zero. The
    output is a view into a NaN-filled buffer with spare heads on both sides, which must keep their
    NaNs: a merge of the workspace's padding rows (a grid of ``block_m`` rows, not ``group * Lq``)
    writes there, where past the output's end it would crash the interpreter instead of failing."""
    from wmtp.attention.triton_merge import merge_splits

    Hkv, group, Lq, block_m = 2, 2, 3, 16
    gen = torch.Generator().manual_seed(n_splits)
    pm = torch.randn(B * Hkv, n_splits, block_m, generator=gen, dtype=torch.float64) * 4
    pl = torch.rand(B * Hkv, n_splits, block_m, generator=gen, dtype=torch.float64) + 0.5
    pacc = torch.randn(B * Hkv, n_splits, block_m, D, generator=gen, dtype=torch.float64)
    empty = [0, 1] + list(range(4, n_splits, 3))  # splits without keys, a whole first chunk of them included
    pm[:, empty], pl[:, empty], pacc[:, empty] = float("-inf"), 0.0, 0.0
    pm[1, :, 4], pl[1, :, 4], pacc[1, :, 4] = float("-inf"), 0.0, 0.0  # a row without keys
    w = torch.exp2(pm - pm.amax(1, keepdim=True).clamp(min=-1e30))  # (B*Hkv, n_splits, block_m)
    want = (w[..., None] * pacc).sum(1) / (w * pl).sum(1).clamp(min=1e-300)[..., None]  # (B*Hkv, block_m, D)
    want = want[:, : group * Lq].reshape(B, Hkv * group, Lq, D)  # row r = (head r // Lq, query r % Lq)
    pad = block_m // Lq  # heads a padding row of the last kv head could reach past the output's
    buf = torch.full((B, pad + Hkv * group + pad, Lq, D), float("nan"), dtype=dtype, device=DEVICE)
    out = buf[:, pad : pad + Hkv * group]  # (B, Hq, Lq, D), batch stride of Hq + 2 * pad heads
    ws = torch.cat([pm.flatten(), pl.flatten(), pacc.flatten()]).to(DEVICE, dtype)  # NOTE [Workspace]: m | l | acc
    merge_splits(ws, out, Hkv, block_m, n_splits, pdl=False, max_chunk=max_chunk)
    assert buf[:, :pad].isnan().all() and buf[:, pad + Hkv * group :].isnan().all()  # no row written outside out
    assert out[0, 3, 1].abs().max() == 0  # kv head 1, row 4 = (its head 1, query 1): no keys
    torch.testing.assert_close(out.double().cpu(), want, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6)


@pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability()[0] < 9, reason="needs an sm_90+ GPU")
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_pdl_changes_no_bit(layout):
    """The merge launched with and without programmatic dependent launch gives the same bits (NOTE [PDL])."""
    q, k, v, q_pos = make_inputs(2, 8, 2, 4, 300, 64, torch.bfloat16, seed=7, device=DEVICE)
    for n_sink, window in ((4, 64), (None, None)):
        outs = [_run("triton", layout, q, k, v, q_pos, n_sink, window, num_splits=5, pdl=p) for p in (False, True)]
        assert torch.equal(outs[0], outs[1])
        assert_kernel_close(outs[1], q, k, v, q_pos, n_sink, window)


def test_pdl_needs_a_hopper_gpu():
    """``pdl=True`` where the GPU (or the CPU interpreter) has no programmatic dependent launch is a ValueError."""
    if CUDA and torch.cuda.get_device_capability()[0] >= 9:
        pytest.skip("this GPU has programmatic dependent launch")
    if not TRITON:
        pytest.skip("Triton needs CUDA or its CPU interpreter")
    from wmtp.attention.triton_attention import attention_triton

    q, k, v, q_pos = make_inputs(1, 4, 2, 1, 40, 32, torch.float32, seed=0, device=DEVICE)
    with pytest.raises(ValueError, match="pdl"):
        attention_triton(q, k, v, q_pos, 4, 8, pdl=True)


SYNC_METHODS = ["tolist", "item", "__int__", "__index__", "__bool__", "__float__", "cpu", "numpy"]


@NEEDS_TRITON
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
@pytest.mark.parametrize("n_sink, window, positions", [(4, 16, None), (None, None, None), (4, 8, [40, 150, 290])])
def test_launcher_never_reads_device_values(n_sink, window, positions, layout, monkeypatch):
    """NOTE [Host sync]: every way to read a tensor's values on the host raises during the call.
    (The CPU interpreter itself calls none of these; the check is the launcher, not the device.)"""
    q, k, v, q_pos = make_inputs(1, 4, 2, 3, 300, 32, torch.float32, seed=3, q_pos=positions, device=DEVICE)
    with monkeypatch.context() as patch:
        for name in SYNC_METHODS:
            def boom(*args, _name=name, **kwargs):
                raise AssertionError(f"host sync: Tensor.{_name} called in the launcher")
            patch.setattr(torch.Tensor, name, boom)
        outs = [_run("triton", layout, q, k, v, q_pos, n_sink, window, num_splits=s, block_n=16) for s in (None, 3)]
    for out in outs:
        assert_kernel_close(out, q, k, v, q_pos, n_sink, window)


@NEEDS_TRITON
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_positions_past_the_cache_are_clamped(layout):
    """Positions are not checked on the host (NOTE [Host sync]); the kernel clamps them to S - 1,
    so a bad position attends like the last one instead of reading outside the cache. Paged, S is the
    block table's reach (3 pages a row), not the pool's 6 pages of two batch rows."""
    q, k, v, _ = make_inputs(2, 4, 2, 2, 48, 32, torch.float32, seed=4, device=DEVICE)  # S = 3 whole pages
    bad, last = torch.tensor([47, 1000], device=DEVICE), torch.tensor([47, 47], device=DEVICE)
    out = _run("triton", layout, q, k, v, bad, 4, 8, num_splits=2, block_n=16)
    assert_kernel_close(out, q, k, v, last, 4, 8)


@NEEDS_TRITON
def test_strided_positions_and_block_table_are_read_by_their_strides():
    """A ``q_pos`` view with a stride (``all_pos[10:40:10]``) and a block table stored column-major
    attend exactly as their contiguous copies (the kernel indexes both as contiguous rows)."""
    q, k, v, _ = make_inputs(2, 4, 2, 3, 64, 32, torch.float32, seed=5, device=DEVICE)
    q_pos = torch.arange(64, device=DEVICE)[10:40:10]  # (3,) [10, 20, 30], stride 10
    assert not q_pos.is_contiguous()
    out = wmtp.attention(q, k, v, q_pos, n_sink=4, window=8, impl="triton")
    assert_kernel_close(out, q, k, v, q_pos.contiguous(), 4, 8)
    k_pages, v_pages, table = paginate(k, v, 16, torch.Generator().manual_seed(5))
    table_cm = table.t().contiguous().t()  # (B, max_pages), the same ids, stride (1, B)
    assert table_cm.stride() != table.stride()
    ref = paged_attention(q, k_pages, v_pages, table, q_pos, n_sink=4, window=8, impl="triton")
    assert torch.equal(paged_attention(q, k_pages, v_pages, table_cm, q_pos, n_sink=4, window=8, impl="triton"), ref)
    assert_kernel_close(ref, q, k, v, q_pos.contiguous(), 4, 8)


@NEEDS_TRITON
def test_bad_positions_are_clamped_both_ways_and_huge_sinks_are_the_whole_prefix():
    """Below 0 attends like position 0 (even below -2^31, where an int32 cast would wrap), and
    ``n_sink`` past the cache (up to 2^64, which Triton cannot pass as an int) like ``n_sink = S``."""
    from wmtp.attention.triton_attention import attention_triton
    q, k, v, _ = make_inputs(1, 4, 2, 2, 48, 32, torch.float32, seed=6, device=DEVICE)
    bad = torch.tensor([-5, -(1 << 32) + 40], device=DEVICE)
    out = attention_triton(q, k, v, bad, 4, 8, num_splits=2, block_n=16)
    assert_kernel_close(out, q, k, v, torch.zeros(2, dtype=torch.long, device=DEVICE), 4, 8)
    pos = torch.tensor([30, 47], device=DEVICE)
    for n_sink in (48, 1 << 40, 1 << 64):
        assert torch.equal(attention_triton(q, k, v, pos, n_sink, 8, block_n=16),
                           attention_triton(q, k, v, pos, 48, 8, block_n=16))


def _huge_head_stride(shape, dtype):
    """A ``(B, Hkv, S, D)`` cache of more than 2^31 elements, lazily allocated: only what is written
    is touched (on CPU a few pages of a 6 GiB mapping)."""
    return torch.empty(shape, dtype=dtype, device=DEVICE)


@NEEDS_TRITON
@pytest.mark.parametrize("where", ["k", "q", "paged", "paged-rows"])
def test_offsets_past_2_to_the_31_elements(where):
    """NOTE [Offsets]: a head at 2^31 elements into a tensor (head 2 of 3 heads of 2^26 x 16) is read
    where it is, not where an int32 product wraps to."""
    g = torch.Generator().manual_seed(8)
    Hkv, S, D = 3, 1 << 26, 16
    small = torch.randn(1, Hkv, 64, D, generator=g).half().to(DEVICE)  # (1, Hkv, 64, D)
    q = torch.randn(1, Hkv, 1, D, generator=g).half().to(DEVICE)  # (1, Hq, 1, D)
    pos = torch.tensor([63], device=DEVICE)
    ref = wmtp.attention(q, small, small, pos, 4, 8, impl="torch")
    if where == "k":  # head stride 2^30: head 2 starts 2^31 elements in
        big = _huge_head_stride((1, Hkv, S, D), torch.float16)
        big[:, :, :64] = small
        out = wmtp.attention(q, big, big, pos, 4, 8, impl="triton")
    elif where == "q":  # a query slice of a long (1, Hq, S, D) buffer
        qbuf = _huge_head_stride((1, Hkv, S, D), torch.float16)
        qbuf[:, :, :1] = q
        out = wmtp.attention(qbuf[:, :, :1], small, small, pos, 4, 8, impl="triton")
    else:
        table = torch.arange(4, dtype=torch.int32, device=DEVICE)[None]  # (1, 4): positions 0-63
        if where == "paged":  # a head-major page pool (Hkv, pages, 16, D) seen as (pages, 16, Hkv, D)
            pool = _huge_head_stride((Hkv, S // 16, 16, D), torch.float16)
            pool[:, :4] = small.reshape(Hkv, 4, 16, D)
            pages = pool.permute(1, 2, 0, 3)
        else:  # a row-major pool (16, pages, Hkv, D): row 15 of a page starts 15 * 3 * 2^26 elements in
            pool = _huge_head_stride((16, S // 16, Hkv, D), torch.float16)
            pool[:, :4] = small[0].reshape(Hkv, 4, 16, D).permute(2, 1, 0, 3)
            pages = pool.permute(1, 0, 2, 3)
        out = paged_attention(q, pages, pages, table, pos, 4, 8, impl="triton")
    assert_kernel_close(out, q, small, small, pos, 4, 8)
    assert (out.float() - ref.float()).abs().max() < 1e-2


@pytest.mark.skipif(not CUDA, reason="the caching allocator it empties is CUDA's")
def test_a_test_leaves_no_more_than_a_gib_cached():
    """tests/gpu_memory.py, run after every test: the 6 GiB tests above no longer leave their worker
    holding 6 GiB that 15 other workers on the same card cannot have.

    The block freed here is larger than all the worker's free cached memory together, so it is a segment
    of its own that the release can hand back: a 1.5 GiB block could be cut from a segment an earlier
    test left partly in use, which no release frees (run DS: 5.0 GB reserved before and after)."""
    from gpu_memory import CUDA_CACHE_LIMIT, release_cached_gpu_memory

    free_cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()  # every free cached block together
    n = max(3 << 29, free_cached + (2 << 20))  # at least 1.5 GiB, and more than any free block holds
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    addr = x.data_ptr()
    del x
    held = _segment_of(addr)  # the cached segment x came from
    before = torch.cuda.memory_reserved()
    assert before > CUDA_CACHE_LIMIT
    assert release_cached_gpu_memory()
    after = torch.cuda.memory_reserved()
    assert after <= before - n, f"x's segment before the release {held}, after {_segment_of(addr)}"


def _segment_of(addr: int) -> dict | None:
    """What the caching allocator's snapshot says of the segment holding ``addr`` (None: not cached):
    run DY kept a 2.16 GB block's segment through the release, as run DS had, and this says why next time."""
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= addr < seg["address"] + seg["total_size"]:
            keys = ("total_size", "allocated_size", "segment_type", "segment_pool_id", "is_expandable", "stream")
            return {k: seg.get(k) for k in keys} | {"blocks": [(b["size"], b["state"]) for b in seg["blocks"][:6]]}
    return None


def _edge_pool(page_stride: int, device: str = "meta") -> torch.Tensor:
    """A (5, 16, 3, 16) fp16 page pool with pages ``page_stride`` elements apart (rows 48, heads 16):
    its largest offset is 4 * page_stride + 767, lazily allocated off ``meta`` (a few pages touched)."""
    flat = torch.empty(4 * page_stride + 768, dtype=torch.float16, device=device)
    return flat.as_strided((5, 16, 3, 16), (page_stride, 48, 16, 1))  # (num_pages, page_size, Hkv, D)


def test_paged_key_loop_offsets_are_int32_below_2_to_the_31():
    """NOTE [Offsets]: the plan's ``OFF`` is int32 for a page pool whose largest offset fits it, int64
    past that and for contiguous caches (the "paged-rows" case above needs int64 and fails with int32)."""
    from wmtp.attention.triton_plan import max_offset, plan_call

    assert max_offset((2, 3), (3, 1)) == 5 and max_offset((4, 3), (1, 4)) == 11 and max_offset((0, 3), (3, 1)) == -1
    q = torch.empty(1, 3, 1, 16, device="meta", dtype=torch.float16)  # (B, Hq, Lq, D)
    pos, table = torch.empty(1, device="meta", dtype=torch.int64), torch.empty(1, 4, device="meta", dtype=torch.int32)
    edge = (2**31 - 768) // 4  # the largest offset 2^31 - 1 exactly; one element more needs int64
    for page_stride, want, literal in ((edge, tl.int32, 0), (edge + 1, tl.int64, edge + 1)):
        pool = _edge_pool(page_stride)
        assert max_offset(pool.shape, pool.stride()) == 4 * page_stride + 767
        kwargs = plan_call(q, pool, pool, table, 16, pos, 4, 64, (None,) * 5, None).kwargs
        assert (kwargs["OFF"], kwargs["ROW"], kwargs["PAGE_STRIDE"]) == (want, tl.int32, literal)
    k = torch.empty(1, 3, 64, 16, device="meta", dtype=torch.float16)  # (B, Hkv, S, D): contiguous keeps int64
    kwargs = plan_call(q, k, k, None, 1, pos, 4, 64, (None,) * 5, None).kwargs
    assert (kwargs["OFF"], kwargs["PAGE_STRIDE"]) == (tl.int64, 0)


def test_the_page_stride_is_a_literal_from_an_offset_of_exactly_2_to_the_31():
    """NOTE [Offsets] (mutation round 15): a pool whose largest offset is 2^31 exactly (two pages 2^31 - 767
    elements apart) has int64 pages, and so the literal stride; a contiguous cache past 2^31 elements
    keeps ``PAGE_STRIDE`` 0, the argument's stride (its kernel reads no page stride)."""
    from wmtp.attention.triton_plan import max_offset, plan_call

    q = torch.empty(1, 3, 1, 16, device="meta", dtype=torch.float16)  # (B, Hq, Lq, D)
    pos, table = torch.empty(1, device="meta", dtype=torch.int64), torch.empty(1, 2, device="meta", dtype=torch.int32)
    flat = torch.empty(2**31 + 1, dtype=torch.float16, device="meta")
    pool = flat.as_strided((2, 16, 3, 16), (2**31 - 767, 48, 16, 1))  # (num_pages, page_size, Hkv, D)
    assert max_offset(pool.shape, pool.stride()) == 2**31
    kwargs = plan_call(q, pool, pool, table, 16, pos, 4, 64, (None,) * 5, None).kwargs
    assert (kwargs["OFF"], kwargs["ROW"], kwargs["PAGE_STRIDE"]) == (tl.int64, tl.int32, 2**31 - 767)
    k = torch.empty(1, 3, 2**26, 16, device="meta", dtype=torch.float16)  # (B, Hkv, S, D): 3 * 2^30 elements
    kwargs = plan_call(q, k, k, None, 1, pos, 4, 64, (None,) * 5, None).kwargs
    assert (kwargs["OFF"], kwargs["ROW"], kwargs["PAGE_STRIDE"]) == (tl.int64, tl.int32, 0)


def test_offsets_within_a_page_are_int32_below_2_to_the_31():
    """NOTE [Offsets]: ``ROW``, the width of a key's offsets within its page, is int32 while a page's
    largest (row, dim) offset fits it: 15 rows of stride ``row_stride`` and 15 dims of stride 1."""
    from wmtp.attention.triton_plan import plan_call

    q = torch.empty(1, 3, 1, 16, device="meta", dtype=torch.float16)  # (B, Hq, Lq, D)
    pos, table = torch.empty(1, device="meta", dtype=torch.int64), torch.empty(1, 4, device="meta", dtype=torch.int32)
    edge = (2**31 - 1 - 15) // 15  # 15 * edge + 15 <= 2^31 - 1 < 15 * (edge + 1) + 15
    for row_stride, want in ((edge, tl.int32), (edge + 1, tl.int64)):
        pool = torch.empty_strided((4, 16, 3, 16), (16 * row_stride, row_stride, 16, 1), device="meta",
                                   dtype=torch.float16)  # (num_pages, page_size, Hkv, D)
        call = plan_call(q, pool, pool, table, 16, pos, 4, 64, (None,) * 5, None)
        assert call.kwargs["ROW"] == want and call.kwargs["OFF"] == tl.int64
    # pages of 2 rows: the largest (row, dim) offset row_stride + 15 is 2^31 - 1, then 2^31 exactly
    for row_stride, want in ((2**31 - 16, tl.int32), (2**31 - 15, tl.int64)):
        pool = torch.empty_strided((4, 2, 3, 16), (2 * row_stride, row_stride, 16, 1), device="meta",
                                   dtype=torch.float16)
        assert plan_call(q, pool, pool, table, 2, pos, 4, 64, (None,) * 5, None).kwargs["ROW"] == want


@NEEDS_TRITON
def test_paged_int32_offsets_reach_the_last_element_below_2_to_the_31():
    """NOTE [Offsets] at its bound: a pool whose last element sits at offset 2^31 - 1 runs with int32
    row offsets and reads its last page's last row where it is."""
    g = torch.Generator().manual_seed(9)
    small = torch.randn(1, 3, 64, 16, generator=g).half().to(DEVICE)  # (1, Hkv, 64, D)
    q = torch.randn(1, 3, 1, 16, generator=g).half().to(DEVICE)  # (1, Hq, 1, D)
    pos = torch.tensor([63], device=DEVICE)
    pool = _edge_pool((2**31 - 768) // 4, DEVICE)
    table = torch.tensor([[0, 1, 2, 4]], dtype=torch.int32, device=DEVICE)  # logical page 3 -> the last page
    for logical, page in enumerate(table[0].tolist()):
        pool[page] = small[0, :, 16 * logical : 16 * logical + 16].transpose(0, 1)  # (16, Hkv, D)
    out = paged_attention(q, pool, pool, table, pos, 4, 8, impl="triton")
    assert_kernel_close(out, q, small, small, pos, 4, 8)


@NEEDS_TRITON
def test_pages_past_2_to_the_31_elements_are_read_where_they_are():
    """NOTE [Offsets]: a page 2^31 + 256 elements into its pool (pages 2^29 + 64 elements apart, so the
    plan's ``OFF`` is int64, the page stride a literal) is read where it is; a page offset formed in int32
    wraps below the pool.
    Its rows stay near its start, so ``ROW`` stays int32 (the "paged-rows" case above is the converse)."""
    from wmtp.attention.triton_plan import plan_call

    g = torch.Generator().manual_seed(10)
    small = torch.randn(1, 3, 64, 16, generator=g).half().to(DEVICE)  # (1, Hkv, 64, D)
    q = torch.randn(1, 3, 1, 16, generator=g).half().to(DEVICE)  # (1, Hq, 1, D)
    pos = torch.tensor([63], device=DEVICE)
    pool = _edge_pool(2**29 + 64, DEVICE)  # page 4 starts at 2^31 + 256
    table = torch.tensor([[0, 1, 2, 4]], dtype=torch.int32, device=DEVICE)  # logical page 3 -> the last page
    for logical, page in enumerate(table[0].tolist()):
        pool[page] = small[0, :, 16 * logical : 16 * logical + 16].transpose(0, 1)  # (16, Hkv, D)
    call = plan_call(q, pool, pool, table, 16, pos, 4, 64, (None,) * 5, None)
    assert (call.kwargs["OFF"], call.kwargs["ROW"], call.kwargs["PAGE_STRIDE"]) == (tl.int64, tl.int32, 2**29 + 64)
    out = paged_attention(q, pool, pool, table, pos, 4, 8, impl="triton")
    assert_kernel_close(out, q, small, small, pos, 4, 8)


@NEEDS_TRITON
def test_contiguous_positions_past_2_to_the_31_elements_are_read_where_they_are():
    """NOTE [Offsets]: a position-major cache (S, Hkv, D) seen as (1, Hkv, S, D), 2^26 positions 48
    elements apart: the query at its last position reads its window 3.2 * 10^9 elements in (int64
    position offsets; int32 ones wrap) and its sinks at the start, as a 12-key cache of those keys."""
    g = torch.Generator().manual_seed(11)
    Hkv, S, D = 3, 1 << 26, 16
    small = torch.randn(1, Hkv, 12, D, generator=g).half().to(DEVICE)  # sinks 0-3, then the window's 8 keys
    q = torch.randn(1, Hkv, 1, D, generator=g).half().to(DEVICE)
    buf = _huge_head_stride((S, Hkv, D), torch.float16)
    buf[:4] = small[0, :, :4].transpose(0, 1)
    buf[S - 8 :] = small[0, :, 4:].transpose(0, 1)
    big = buf.permute(1, 0, 2)[None]  # (1, Hkv, S, D), position stride Hkv * D
    out = wmtp.attention(q, big, big, torch.tensor([S - 1], device=DEVICE), 4, 8, impl="triton")
    assert_kernel_close(out, q, small, small, torch.tensor([11], device=DEVICE), 4, 8)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
def test_tensors_on_a_gpu_other_than_the_current_one(layout):
    """Triton launches on the current CUDA device: tensors on another GPU must run on theirs."""
    q, k, v, q_pos = make_inputs(1, 8, 2, 3, 300, 64, torch.bfloat16, seed=9, device="cuda:1")
    with torch.cuda.device(0):
        out = _run("triton", layout, q, k, v, q_pos, 4, 16)
    assert out.device == q.device
    assert_kernel_close(out, q, k, v, q_pos, 4, 16)


@NEEDS_TRITON
def test_public_op_checks_what_costs_no_sync():
    """Positions given on the host are range-checked before they move; an empty cache and a GQA
    group wider than the kernel's tile are rejected from shapes (NOTE [Host checks] in
    wmtp/attention/arguments.py)."""
    q, k, v, _ = make_inputs(1, 4, 2, 2, 20, 32, torch.float32, seed=0, device=DEVICE)
    for bad in ([0, 20], torch.tensor([-1, 3])):
        with pytest.raises(ValueError, match="positions"):
            wmtp.attention(q, k, v, bad, 2, 4, impl="triton")
    with pytest.raises(ValueError, match="no positions"):
        wmtp.attention(q, k[:, :, :0], v[:, :, :0], [0, 0], impl="triton")
    wide = torch.zeros(1, 128, 1, 256, dtype=torch.float64, device=DEVICE)  # 128 query heads on 1 kv head
    kv = torch.zeros(1, 1, 4, 256, dtype=torch.float64, device=DEVICE)
    assert resolve_impl("auto", DEVICE, torch.float64, 256, group=128) == "torch"
    with pytest.raises(ValueError, match="query heads per kv head"):
        wmtp.attention(wide, kv, kv, [3], impl="triton")
    from wmtp.attention.triton_attention import attention_triton
    with pytest.raises(ValueError, match="query heads per kv head"):
        attention_triton(wide, kv, kv, torch.tensor([3], device=DEVICE))


@NEEDS_TRITON
def test_public_ops_refuse_what_the_kernels_cannot_take_with_a_value_error():
    """wmtp.attention's input contract for both impls: one device, floating tensors, integer
    positions; for Triton also one dtype, one k/v layout and no autograd (impl='auto' takes the
    reference there, impl='triton' says why). A query strided in its head dim is made contiguous."""
    q, k, v, pos = make_inputs(1, 4, 2, 2, 20, 32, torch.float32, seed=1, device=DEVICE)
    for impl in ("torch", "triton"):
        for bad_pos in (pos.float(), pos > 3):
            with pytest.raises(ValueError, match="integer positions"):
                wmtp.attention(q, k, v, bad_pos, 2, 4, impl=impl)
        with pytest.raises(ValueError, match="one device"):
            wmtp.attention(q, k.to("meta"), v, pos, 2, 4, impl=impl)
        with pytest.raises(ValueError, match="floating point"):
            wmtp.attention(q, k.long(), v.long(), pos, 2, 4, impl=impl)
    ref = wmtp.attention(q, k, v, pos, 2, 4, impl="torch")
    strided_v = v.transpose(2, 3).contiguous().transpose(2, 3)  # (B, Hkv, S, D) with a strided head dim
    for args, why in (((q, k.double(), v.double()), "different dtypes"), ((q, k, strided_v), "two layouts"),
                      ((q.clone().requires_grad_(), k, v), "require grad")):
        with pytest.raises(ValueError, match=why):
            wmtp.attention(*args, pos, 2, 4, impl="triton")
        torch.testing.assert_close(wmtp.attention(*args, pos, 2, 4, impl="torch").float(), ref.double().float())
    with torch.no_grad():  # no autograd: the kernel serves
        torch.testing.assert_close(wmtp.attention(q.clone().requires_grad_(), k, v, pos, 2, 4, impl="triton"), ref)
    q_t = q.transpose(2, 3).contiguous().transpose(2, 3)  # (B, Hq, Lq, D), head dim strided
    torch.testing.assert_close(wmtp.attention(q_t, k, v, pos, 2, 4, impl="triton"), ref)


def test_the_kernels_contract_refuses_what_the_public_op_would_have_caught():
    """``plan.check_tensors``, the launcher's own contract behind the public op's checks, raises
    ValueErrors (assertions would vanish under ``python -O``): a head dim that is not a power of two
    in [16, 256], k and v of two layouts, two dtypes, two devices, a strided head dim."""
    from wmtp.attention.plan import check_tensors

    q, k, v, pos = make_inputs(1, 4, 2, 2, 20, 32, torch.float32, seed=1)
    check_tensors(q, k, v, pos)
    for D in (8, 48, 512):
        qd, kd, vd, _ = make_inputs(1, 4, 2, 2, 20, D, torch.float32, seed=1)
        with pytest.raises(ValueError, match="^head_dim must be a power of two in \\[16, 256\\], got " + str(D)):
            check_tensors(qd, kd, vd, pos)
    with pytest.raises(ValueError, match="^k and v must have one shape and one layout$"):
        check_tensors(q, k, v.transpose(2, 3).contiguous().transpose(2, 3), pos)
    with pytest.raises(ValueError, match="^q, k, v must share one dtype of fp16/bf16/fp32/fp64, got torch.float32, "
                                         "torch.float64, torch.float64$"):
        check_tensors(q, k.double(), v.double(), pos)
    with pytest.raises(ValueError, match="^all tensors must be on one device$"):
        check_tensors(q, k, v, pos.to("meta"))
    strided = (q.transpose(2, 3).contiguous().transpose(2, 3), k.transpose(2, 3).contiguous().transpose(2, 3))
    for qs, ks in ((strided[0], k), (q, strided[1])):
        with pytest.raises(ValueError, match="^the head dimension must be contiguous$"):
            check_tensors(qs, ks, ks if ks is not k else v, pos)


@NEEDS_TRITON
def test_caches_past_2_to_the_30_positions_are_refused():
    """The kernel's positions are int32 and ``window=None`` runs as a window of ``FULL`` = 2**30, so
    a cache may hold at most 2**30 key positions: more would drop the first keys of a full causal
    set. The plan refuses S = 2**30 + 1 (contiguous) and a block table of 2**26 + 1 pages of 16;
    2**30 exactly plans. The public ops say so for ``impl="triton"`` and take the reference for
    ``"auto"`` (stride-0 caches: no memory)."""
    from wmtp.attention import _prepare
    from wmtp.attention.triton_plan import FULL, plan_call

    assert FULL == 2**30
    q = torch.empty(1, 2, 1, 16, device="meta", dtype=torch.float16)  # (B, Hq, Lq, D)
    pos = torch.empty(1, device="meta", dtype=torch.int64)
    why = "^the Triton kernel reads caches of at most 2\\*\\*30 key positions, got {}; use impl='torch'$"
    for S in (2**30, 2**30 + 1):
        k = torch.empty(1, 1, S, 16, device="meta", dtype=torch.float16)  # (B, Hkv, S, D)
        pages = torch.empty(4, 16, 1, 16, device="meta", dtype=torch.float16)  # (num_pages, page_size, Hkv, D)
        table = torch.empty(1, -(-S // 16), device="meta", dtype=torch.int32)  # 2**26 (+ 1) pages of 16
        if S == 2**30:
            assert plan_call(q, k, k, None, 1, pos, 0, None, (None,) * 5, None).kwargs["HEAD_DIM"] == 16
            assert plan_call(q, pages, pages, table, 16, pos, 0, None, (None,) * 5, None).kwargs["PAGED"]
            continue
        with pytest.raises(ValueError, match=why.format(2**30 + 1)):
            plan_call(q, k, k, None, 1, pos, 0, None, (None,) * 5, None)
        with pytest.raises(ValueError, match=why.format(2**30 + 16)):
            plan_call(q, pages, pages, table, 16, pos, 0, None, (None,) * 5, None)
    qr, pr = torch.zeros(1, 2, 1, 16, device=DEVICE), torch.tensor([5], device=DEVICE)
    big = torch.zeros(1, 1, 1, 16, device=DEVICE).expand(1, 1, 2**30 + 1, 16)  # (B, Hkv, S, D), stride 0 in S
    why = "^impl='triton' does not support a cache of 1073741825 key positions \\(the kernels' positions are int32"
    with pytest.raises(ValueError, match=why + ": at most 2\\*\\*30\\); use impl='torch'$"):
        wmtp.attention(qr, big, big, pr, 0, None, impl="triton")
    pool = torch.zeros(1, 16, 1, 16, device=DEVICE)  # one page of 16
    table = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE).expand(1, 2**26 + 1)
    with pytest.raises(ValueError, match="^impl='triton' does not support a cache of 1073741840 key positions"):
        paged_attention(qr, pool, pool, table, pr, 0, None, impl="triton")
    if CUDA:  # where "auto" would pick the kernel
        assert _prepare(qr, big, big, pr, "auto")[0] == "torch"
        assert _prepare(qr, big[..., : 2**30, :], big[..., : 2**30, :], pr, "auto")[0] == "triton"


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=NEEDS_TRITON)])
def test_paged_op_checks_the_block_table_where_it_costs_no_sync(impl):
    """A page id outside the pool is an error, not another page (torch indexes -1 from the end).
    NOTE [Host sync]: Triton checks page ids only in a host table (the interpreter's); on a GPU it
    does not read the table back, so there only the table's device is checked."""
    q, k, v, pos = make_inputs(1, 4, 2, 2, 64, 32, torch.float32, seed=2, device=DEVICE)
    k_pages, v_pages, table = paginate(k, v, 16, torch.Generator().manual_seed(2))
    for page in (-1, k_pages.shape[0]) if impl == "torch" or table.device.type == "cpu" else ():
        bad = table.clone()
        bad[0, int(pos.max()) // 16] = page
        with pytest.raises(ValueError, match="must lie in"):
            paged_attention(q, k_pages, v_pages, bad, pos, 2, 4, impl=impl)
    with pytest.raises(ValueError, match="q's device"):
        paged_attention(q, k_pages, v_pages, table.to("meta"), pos, 2, 4, impl=impl)
    if impl == "torch" or table.device.type == "cpu":  # pages past the queries' reach are never read
        past = table.clone()
        past[0, 2:] = -1
        paged_attention(q, k_pages, v_pages, past, pos - 40, 2, 4, impl=impl)  # at 22, 23: pages 0 and 1
    if impl == "torch" or table.device.type == "cpu":  # positions per row: each row's own reach
        q2, rows = torch.cat([q, q]), torch.stack([pos - 40, pos])  # (2, Hq, 2, D); row 0 at 22, 23: page 1
        table2 = torch.cat([table, table])  # (2, 4)
        table2[0, 2:] = -1  # past row 0's reach: never read
        paged_attention(q2, k_pages, v_pages, table2, rows, 2, 4, impl=impl)
        table2[0, 1] = -1  # row 0 reads page 1
        with pytest.raises(ValueError, match="must lie in"):
            paged_attention(q2, k_pages, v_pages, table2, rows, 2, 4, impl=impl)


def test_key_plan_reads_the_union_and_masks_only_the_edges():
    """Host-side blocking: the two ranges hold the union of the key sets and no other key, the
    unmasked blocks only keys every query reads, and the draft's work does not grow with S."""
    from wmtp.attention.plan import key_plan

    rng = random.Random(0)
    for _ in range(500):
        n_sink, window = rng.choice([0, 1, 4, 64]), rng.choice([None, 1, 3, 16, 100])
        Lq, t_min, block_n = rng.randint(1, 16), rng.randint(0, 400), rng.choice([16, 64])
        t = torch.arange(t_min, t_min + Lq)
        p = key_plan(t_min, t_min + Lq - 1, n_sink, window, block_n)
        mask = draft_key_mask(t, t_min + Lq, n_sink, window)  # (Lq, S)
        union, every = mask.any(0), mask.all(0)
        assert 0 <= p.sink_hi <= p.rec_lo <= p.rec_hi == t_min + Lq
        iterated = torch.zeros_like(union)
        iterated[: p.sink_hi] = True
        iterated[p.rec_lo : p.rec_hi] = True
        assert torch.equal(iterated, union), (n_sink, window, t_min, Lq)
        for lo, hi, u1, u2, n_blk in [(0, p.sink_hi, p.sink_u1, p.sink_u2, p.n_blk_sink),
                                      (p.rec_lo, p.rec_hi, p.rec_u1, p.rec_u2, p.n_blk_rec)]:
            assert n_blk == -(-(hi - lo) // block_n) and 0 <= u1 <= u2 <= n_blk
            assert u1 == u2 or lo + u2 * block_n <= hi  # unmasked blocks are whole
            assert every[lo + u1 * block_n : lo + u2 * block_n].all()
            assert n_blk - (u2 - u1) <= 2 + 2 * -(-Lq // block_n)  # masked: only the edges
        if window is not None:
            assert p.sink_hi + (p.rec_hi - p.rec_lo) <= n_sink + window + Lq - 1


@triton.jit
def _plan_probe(T_MIN, T_MAX, N_SINK, WINDOW, OUT, total, N: tl.constexpr, BLOCK_N: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)  # N cases a program
    plan = _key_plan(tl.load(T_MIN + i), tl.load(T_MAX + i), tl.load(N_SINK + i), tl.load(WINDOW + i), BLOCK_N)
    for j in tl.static_range(8):
        tl.store(OUT + j * total + i, plan[j])


@NEEDS_TRITON
@pytest.mark.parametrize("block_n", [16, 64])
def test_device_key_plan_matches_key_plan(block_n):
    """The kernel's on-device plan (NOTE [Host sync]) equals the host key_plan, scattered tiles included:
    every first query from 0 to 135 (each block edge of both block sizes, inside the 64 sinks and past
    them; random cases let an edge off by one through), for every span, sink count and window."""
    import itertools

    from wmtp.attention.plan import key_plan
    from wmtp.attention.triton_attention import FULL

    cases = [(t_min, t_min + span, n_sink, window) for t_min, span, n_sink, window in itertools.product(
        range(136), [0, 1, 7, 15, 300], [0, 1, 4, 64], [None, 1, 3, 16, 100])]  # 13600
    cases += cases[: -len(cases) % 1024]  # whole programs of 1024 cases
    t_min, t_max, n_sink, window = (torch.tensor(c, dtype=torch.int32, device=DEVICE) for c in zip(*[
        (a, b, 0 if w is None else ns, FULL if w is None else w) for a, b, ns, w in cases]))
    out = torch.empty(8, len(cases), dtype=torch.int32, device=DEVICE)
    _plan_probe[(len(cases) // 1024,)](t_min, t_max, n_sink, window, out, len(cases), N=1024, BLOCK_N=block_n)
    for case, got in zip(cases, out.T.tolist()):
        p = key_plan(*case, block_n)
        assert p.sink_u1 == 0 and got == [p.sink_hi, p.n_blk_sink, p.sink_u2, p.rec_lo, p.rec_hi, p.n_blk_rec,
                                          p.rec_u1, p.rec_u2], case


@NEEDS_TRITON
def test_a_group_past_the_tile_and_q_sink_of_another_layout():
    """65 float32 query heads a kv head, one past the tile's 64 rows, are refused by the public op
    with impl='triton'; a contiguous ``q_sink`` beside a transposed ``q`` is read at its own strides
    (mutation round 10: both are copied to one layout whenever their strides differ; ``q_sink``
    passed through because it was contiguous, and so read at q's strides, survived every test)."""
    q, k, v, q_pos = make_inputs(1, 65, 1, 1, 8, 16, torch.float32, seed=0, device=DEVICE)
    with pytest.raises(ValueError, match="65 query heads per kv head"):
        wmtp.attention(q, k, v, q_pos, impl="triton")
    q, k, v, _ = make_inputs(1, 2, 1, 3, 20, 16, torch.float32, seed=1, device=DEVICE)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, Hq, Lq, D), the model's layout
    q_sink = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)  # contiguous
    q_pos = torch.tensor([17, 18, 19], device=DEVICE)
    out = wmtp.attention(q, k, v, q_pos, n_sink=2, window=4, impl="triton", q_sink=q_sink)
    assert_kernel_close(out, q, k, v, q_pos, 2, 4, q_sink)


def test_impl_switch_with_triton():
    dev = torch.device(DEVICE)
    assert resolve_impl("auto", dev) == ("triton" if CUDA else "torch")
    assert resolve_impl("auto", dev, torch.float64) == ("triton" if CUDA else "torch")  # fp64: GPU losslessness
    assert resolve_impl("auto", dev, torch.int32) == "torch"  # the kernel takes fp16/bf16/fp32/fp64
    if TRITON:
        assert resolve_impl("triton", dev) == "triton"
        with pytest.raises(ValueError, match="int32"):
            resolve_impl("triton", dev, torch.int32)
        with pytest.raises(ValueError, match="head_dim"):
            resolve_impl("triton", dev, torch.float32, 96)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CUDA"):
        resolve_impl("triton", "cpu")
    assert resolve_impl("auto", "cpu") == "torch"


def test_paged_attention_validates_inputs():
    q, k, v, q_pos = make_inputs(1, 4, 2, 2, 20, 32, torch.float32, seed=0, device=DEVICE)
    k_pages, v_pages, block_table = paginate(k, v, 4, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="int32"):
        paged_attention(q, k_pages, v_pages, block_table.long(), q_pos, impl="torch")
    with pytest.raises(ValueError, match="positions"):
        paged_attention(q, k_pages, v_pages, block_table, q_pos + 10, impl="torch")
    with pytest.raises(ValueError, match="expected"):
        paged_attention(q, k_pages, v_pages[:, :2], block_table, q_pos, impl="torch")
