"""Tests of the public attention op ``wmtp.attention`` and its PyTorch reference.

Ground truth and tolerances come from tests/attention_truth.py (float64, dense over all keys,
masked by ``draft_key_mask``; NOTE [Tolerances] there). A second check compares the full causal
case with ``torch`` SDPA. Shapes are deliberately awkward (STYLE.md lesson 5): cache lengths that
are not block multiples, lengths around ``n_sink + window``, prefills longer than the reference's
256-query block.
"""


import re

import pytest
import torch
import torch.nn.functional as F
from attention_truth import ATOL, assert_reference_close, dtype_id, make_inputs, truth

import wmtp
from wmtp.attention import resolve_impl
from wmtp.attention.paged import paginate
from wmtp.attention.reference import _query_blocks, _ranges
from wmtp.keyset import draft_key_mask

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


# (B, Hq, Hkv, Lq, S, D, n_sink, window); queries at the last Lq positions, or q_pos=arange(S) when Lq == S.
SHAPES = [
    pytest.param(2, 1, 1, 1, 37, 32, 4, 8, id="decode-S37"),
    pytest.param(1, 4, 1, 8, 100, 64, 4, 16, id="verify-S100-gqa4"),
    pytest.param(1, 8, 2, 8, 257, 128, 4, 64, id="verify-S257-D128"),
    pytest.param(1, 4, 4, 1, 600, 64, 4, 100, id="decode-S600-mha"),
    pytest.param(1, 4, 1, 8, 600, 32, None, None, id="verify-S600-full"),
    pytest.param(1, 4, 1, 300, 300, 32, 4, 32, id="prefill-L300-sinks"),
    pytest.param(1, 4, 1, 300, 300, 32, 0, 32, id="prefill-L300-nosink"),
    pytest.param(1, 8, 2, 300, 300, 32, None, None, id="prefill-L300-full"),
    pytest.param(1, 4, 1, 300, 300, 32, 1, 1, id="prefill-L300-window1"),
    pytest.param(1, 4, 1, 8, 9, 64, 4, 6, id="verify-S=ns+w-1"),
    pytest.param(1, 4, 1, 8, 10, 64, 4, 6, id="verify-S=ns+w"),
    pytest.param(1, 4, 1, 8, 11, 64, 4, 6, id="verify-S=ns+w+1"),
    pytest.param(1, 4, 1, 1, 9, 64, 4, 6, id="decode-S=ns+w-1"),
    pytest.param(1, 4, 1, 1, 10, 64, 4, 6, id="decode-S=ns+w"),
    pytest.param(1, 4, 1, 1, 11, 64, 4, 6, id="decode-S=ns+w+1"),
    pytest.param(1, 4, 4, 8, 37, 64, 0, 5, id="verify-nosink"),
    pytest.param(1, 4, 1, 8, 37, 32, 2, 1, id="verify-window1"),
    pytest.param(1, 1, 1, 8, 37, 32, 0, 1, id="verify-window1-nosink"),
    pytest.param(1, 8, 2, 1, 37, 128, None, None, id="decode-both-None"),
    pytest.param(1, 4, 1, 8, 37, 32, 40, 4, id="verify-n_sink>S"),
    pytest.param(1, 4, 1, 2, 37, 32, 4, 8, id="verify-Lq2"),  # a block of 2 queries: the formula masks it
]


@pytest.mark.parametrize("impl", ["torch", "auto"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("B, Hq, Hkv, Lq, S, D, n_sink, window", SHAPES)
def test_matches_float64truth(B, Hq, Hkv, Lq, S, D, n_sink, window, dtype, impl):
    q, k, v, q_pos = make_inputs(B, Hq, Hkv, Lq, S, D, dtype, seed=S + Lq)
    out = wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl=impl)
    assert_reference_close(out, truth(q, k, v, q_pos, n_sink, window), dtype)


def test_window1_nosink_returns_own_value():
    q, k, v, q_pos = make_inputs(1, 4, 2, 5, 20, 32, torch.float64, seed=1)
    out = wmtp.attention(q, k, v, q_pos, n_sink=0, window=1, impl="torch")
    own = v.repeat_interleave(2, dim=1)[:, :, q_pos]  # (B, Hq, Lq, D)
    torch.testing.assert_close(out, own, atol=ATOL[torch.float64], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("S, Hq, Hkv", [(37, 1, 1), (300, 8, 2)])
def test_full_causal_matches_sdpa(S, Hq, Hkv, dtype):
    """window=None and q_pos=arange(S) is plain causal attention: compare with SDPA in float64."""
    q, k, v, _ = make_inputs(1, Hq, Hkv, S, S, 64, dtype, seed=7)
    out = wmtp.attention(q, k, v, torch.arange(S), n_sink=None, window=None, impl="torch")
    q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
    sdpa = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, enable_gqa=Hq != Hkv)
    assert_reference_close(out, sdpa, dtype)


# (Lq, S, start, n_sink, window): queries mid-cache, keys after them hold garbage.
MID_CACHE = [
    pytest.param(8, 100, 40, 4, 16, id="verify-window"),
    pytest.param(1, 100, 57, 0, 5, id="decode-nosink"),
    pytest.param(8, 100, 40, None, None, id="verify-full"),
    pytest.param(300, 400, 0, 0, 32, id="prefill-L300"),
]


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("Lq, S, start, n_sink, window", MID_CACHE)
def test_future_keys_are_never_read(Lq, S, start, n_sink, window, dtype, fill):
    q, k, v, q_pos = make_inputs(1, 4, 2, Lq, S, 32, dtype, seed=3, q_pos=range(start, start + Lq))
    assert int(q_pos.max()) + 1 < S
    clean = wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl="torch")
    value = torch.finfo(dtype).max if fill == "max" else fill
    k2, v2 = k.clone(), v.clone()
    k2[:, :, int(q_pos.max()) + 1 :] = value
    v2[:, :, int(q_pos.max()) + 1 :] = value
    out = wmtp.attention(q, k2, v2, q_pos, n_sink=n_sink, window=window, impl="torch")
    assert torch.isfinite(out).all()
    assert torch.equal(out, clean)
    assert_reference_close(out, truth(q, k, v, q_pos, n_sink, window), dtype)


def _nan_outside_key_sets(k, v, q_pos, n_sink, window):
    """NaN into k and v at every position <= max(q_pos) that no query's key set contains."""
    S = k.shape[2]
    read = draft_key_mask(q_pos, S, n_sink, window).any(dim=0)  # (S,) union of the key sets
    outside = ~read & (torch.arange(S) <= q_pos.max())
    k, v = k.clone(), v.clone()
    k[:, :, outside] = float("nan")
    v[:, :, outside] = float("nan")
    return k, v, int(outside.sum())


# (Lq, S, n_sink, window, q_pos or None for the last Lq positions)
NAN_CASES = [
    pytest.param(1, 600, 4, 32, None, id="decode-S600"),
    pytest.param(8, 257, 4, 16, None, id="verify-S257"),
    pytest.param(8, 100, 0, 8, None, id="verify-nosink"),
    pytest.param(8, 100, 2, 1, None, id="verify-window1"),
    pytest.param(4, 300, 4, 8, [50, 51, 52, 53], id="verify-mid-cache"),
    pytest.param(3, 300, 4, 8, [40, 150, 290], id="scattered-queries"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("Lq, S, n_sink, window, positions", NAN_CASES)
def test_reads_only_the_key_set(Lq, S, n_sink, window, positions, dtype):
    """NaN anywhere outside every query's key set must not reach the output."""
    q, k, v, q_pos = make_inputs(2, 4, 2, Lq, S, 32, dtype, seed=11)
    if positions is not None:
        q_pos = torch.tensor(positions)
    clean = wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl="torch")
    k_nan, v_nan, n_poisoned = _nan_outside_key_sets(k, v, q_pos, n_sink, window)
    assert n_poisoned > 0  # the case must actually poison something
    out = wmtp.attention(q, k_nan, v_nan, q_pos, n_sink=n_sink, window=window, impl="torch")
    assert torch.isfinite(out).all(), f"NaN leaked into queries {(~torch.isfinite(out)).any(-1).nonzero().tolist()}"
    assert torch.equal(out, clean)


def _layout(x, layout):
    """The same ``(B, H, S, D)`` values in another memory layout: ``seq-major`` stores them ``(B, S, H, D)``
    (a model's projections transposed), ``head-padded`` the first ``H`` heads of a buffer with one more;
    in neither do the batch and head dims merge into one (NOTE [Batched matmuls], reference.py)."""
    if layout == "seq-major":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "head-padded":
        return torch.cat([x, torch.full_like(x[:, :1], float("nan"))], 1)[:, : x.shape[1]]
    return x


@pytest.mark.parametrize("layout", ["contiguous", "seq-major", "head-padded"])
@pytest.mark.parametrize("Lq, n_sink, window", [(1, 4, 8), (8, 4, 8), (8, None, None)])
def test_cache_layouts_match_truth(layout, Lq, n_sink, window):
    """Caches whose batch and head dims do not merge (B = 2) give the same attention as a contiguous one."""
    q, k, v, q_pos = make_inputs(2, 4, 2, Lq, 50, 32, torch.float32, seed=13)
    k2, v2 = _layout(k, layout), _layout(v, layout)
    assert torch.equal(k2, k) and (layout == "contiguous") == (k2.stride(0) == 2 * k2.stride(1))
    out = wmtp.attention(q, k2, v2, q_pos, n_sink=n_sink, window=window, impl="torch")
    assert_reference_close(out, truth(q, k, v, q_pos, n_sink, window), torch.float32)


@pytest.mark.parametrize("B, layout", [(1, "seq-major"), (2, "contiguous"), (2, "seq-major"), (2, "head-padded")])
def test_reference_slices_the_cache_in_place(B, layout):
    """Each range the reference reads is a view of the cache where batch and head dims merge (a batch of
    one always), else a copy of that range's positions alone: never of the whole cache."""
    k = _layout(torch.randn(B, 3, 40, 8, generator=torch.Generator().manual_seed(0)), layout)  # (B, 3, 40, D)
    rows = _ranges(k, [(0, 4), (30, 40)], torch.float32)
    for r, (a, b) in zip(rows, [(0, 4), (30, 40)]):
        assert r.shape == (3 * B, b - a, 8) and torch.equal(r, k[:, :, a:b].reshape(3 * B, b - a, 8))
        if B == 1 or layout == "contiguous":
            assert r.data_ptr() == k[0, 0, a].data_ptr()  # a view: no copy
        else:
            assert r.untyped_storage().nbytes() == r.numel() * r.element_size()  # a copy of b - a positions


def test_impl_switch(monkeypatch):
    """No silent fallback: triton off CUDA (and without the interpreter) raises."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_impl("auto", "cpu") == "torch"
    assert resolve_impl("torch", "cpu") == "torch"
    q, k, v, q_pos = make_inputs(1, 2, 1, 1, 10, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="triton"):
        wmtp.attention(q, k, v, q_pos, n_sink=2, window=4, impl="triton")
    with pytest.raises(ValueError, match="triton"):
        resolve_impl("triton", "cpu")
    with pytest.raises(ValueError, match="unknown"):
        wmtp.attention(q, k, v, q_pos, impl="flash")
    with pytest.raises(ValueError, match="unknown"):
        resolve_impl("flash", "cpu")
    with pytest.raises(ValueError, match="bad device"):  # was torch's RuntimeError
        resolve_impl("torch", "nope")
    for device in (None, torch.zeros(2)):  # one line, not torch's signatures (nor a tensor's repr)
        with pytest.raises(ValueError, match=r"^bad device: give a torch.device .*, got (NoneType|Tensor)$"):
            resolve_impl("auto", device)
    with pytest.raises(ValueError, match="dtype must be a torch.dtype"):  # "auto" chose the reference silently
        resolve_impl("auto", "cpu", "float16")
    with pytest.raises(ValueError, match="head_dim must be an int"):
        resolve_impl("auto", "cpu", torch.float16, "64")


def test_impl_resolution_at_its_bounds(monkeypatch):
    """Mutation round 10 (each survived every test): ``"auto"`` on CUDA takes the reference for a head
    dim or a group the kernel lacks (a CUDA device named, no tensor needed), and without triton;
    ``"triton"`` without triton, or on a device the interpreter does not serve (meta), raises; a
    bool head_dim or group, and a negative device index, are refused by name."""
    import importlib

    ops = importlib.import_module("wmtp.attention")  # the module (wmtp.attention is the op)
    if ops._triton_importable():
        assert resolve_impl("auto", "cuda", torch.float32, 16, 64) == "triton"  # a tile of 64 rows: fits
    assert resolve_impl("auto", "cuda", torch.float32, 48) == "torch"
    assert resolve_impl("auto", "cuda", torch.float32, 16, 65) == "torch"
    for name, args in (("head_dim", (True, None)), ("group", (16, True))):
        with pytest.raises(ValueError, match=f"{name} must be an int or None, got True"):
            resolve_impl("auto", "cpu", torch.float32, *args)
    with pytest.raises(ValueError, match="^bad device -1: "):
        resolve_impl("auto", -1)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_impl("triton", "meta")
    monkeypatch.setattr(ops, "_triton_importable", lambda: False)
    assert resolve_impl("auto", "cuda") == "torch"
    with pytest.raises(ValueError, match="needs the triton package"):
        resolve_impl("triton", "cuda")


def test_v_on_another_device_or_not_floating_and_pages_of_no_heads_are_refused():
    """Mutation round 10: the public ops check ``v`` as they check ``k`` (v's device and dtype
    unchecked survived every test), pages of no kv heads do not fit any q, and a position at the
    block table's reach (``max_pages * page_size``) is past it (the reach taken one larger survived)."""
    q, k, v, q_pos = make_inputs(1, 2, 1, 2, 12, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="one device"):
        wmtp.attention(q, k, v.to("meta"), q_pos, impl="torch")
    with pytest.raises(ValueError, match="floating point"):
        wmtp.attention(q, k, v.long(), q_pos, impl="torch")
    k_pages, v_pages, table = paginate(k, v, 4, torch.Generator().manual_seed(0))  # 3 pages of 4: reach 12
    with pytest.raises(ValueError, match="does not fit k_pages"):
        wmtp.paged_attention(q, k_pages[:, :, :0], v_pages[:, :, :0], table, q_pos, impl="torch")
    with pytest.raises(ValueError, match="positions"):
        wmtp.paged_attention(q, k_pages, v_pages, table, torch.tensor([10, 12]), impl="torch")
    assert wmtp.paged_attention(q, k_pages, v_pages, table, torch.tensor([10, 11]), impl="torch").shape == q.shape


def test_paged_arguments_must_be_tensors():
    q, k, v, q_pos = make_inputs(1, 4, 2, 3, 16, 16, torch.float32, seed=0)
    pages = k[0].transpose(0, 1).reshape(4, 4, 2, 16)  # (num_pages, page_size, Hkv, D)
    table = torch.arange(4, dtype=torch.int32)[None]  # (1, 4)
    wmtp.paged_attention(q, pages, pages, table, q_pos, 2, 4, impl="torch")
    for args, name in (((q, pages, pages, table.tolist()), "block_table"),  # AttributeErrors before
                       ((q, pages.tolist(), pages, table), "k_pages"), ((q.numpy(), pages, pages, table), "q")):
        with pytest.raises(ValueError, match=f"^{name} must be a torch.Tensor"):
            wmtp.paged_attention(*args, q_pos, 2, 4, impl="torch")
    with pytest.raises(ValueError, match="q_sink must be a torch.Tensor, got list"):
        wmtp.paged_attention(q, pages, pages, table, q_pos, 2, 4, impl="torch", q_sink=q.tolist())


def test_a_paged_shape_mismatch_names_the_pages_and_the_block_table():
    q, k, v, q_pos = make_inputs(1, 4, 2, 3, 16, 16, torch.float32, seed=0)
    pages = k[0].transpose(0, 1).reshape(4, 4, 2, 16)  # (num_pages, page_size, Hkv, D)
    table = torch.arange(4, dtype=torch.int32)[None]  # (1, 4)
    for args, shapes in (((q, pages, pages, table.repeat(2, 1)), "(1, 4, 3, 16) does not fit k_pages (4, 4, 2, 16) "
                          "and block_table (2, 4)"),  # before: "does not fit k (2, 2, 16, 16)", a shape never given
                         ((q[..., :8], pages, pages, table), "(1, 4, 3, 8) does not fit k_pages (4, 4, 2, 16)"),
                         ((q[:, :3], pages, pages, table), "(1, 3, 3, 16) does not fit k_pages (4, 4, 2, 16)")):
        for impl in ("torch", "triton"):
            with pytest.raises(ValueError, match="^q " + re.escape(shapes)):
                wmtp.paged_attention(*args, q_pos, 2, 4, impl=impl)


def _bad_inputs():
    q, k, v, q_pos = make_inputs(1, 4, 2, 3, 10, 16, torch.float32, seed=0)
    return {
        "q_pos-too-long": ((q, k, v, torch.arange(4)), "q_pos"),
        "q_pos-too-short": ((q, k, v, torch.arange(2)), "q_pos"),
        "q_pos-rows!=B": ((q, k, v, torch.arange(3).repeat(2, 1)), r"q_pos must have shape \(3,\) or \(1, 3\)"),
        "q_pos-3-D": ((q, k, v, torch.arange(3)[None, None]), "q_pos"),
        "q_pos-row>=S": ((q, k, v, torch.tensor([[7, 8, 10]])), "positions"),
        "q_pos>=S": ((q, k, v, torch.tensor([7, 8, 10])), "positions"),
        "q_pos<0": ((q, k, v, torch.tensor([-1, 0, 1])), "positions"),
        "Hq%Hkv": ((q[:, :3], k, v, q_pos), "Hq"),
        "head_dim": ((q, k[..., :8], v[..., :8], q_pos), "head_dim"),
        "batch": ((q, torch.cat([k, k]), torch.cat([v, v]), q_pos), "batch"),
        "k!=v": ((q, k, v[:, :, :9], q_pos), "expected"),
        "3-D": ((q[0], k[0], v[0], q_pos), "expected"),
        "B=0": ((q[:0], k[:0], v[:0], q_pos), "empty"),  # torch failed in a reshape, Triton returned nothing
        "D=0": ((q[..., :0], k[..., :0], v[..., :0], q_pos), "empty"),  # a ZeroDivisionError
        # AttributeErrors, TypeErrors and RuntimeErrors from inside before
        "q-list": ((q.tolist(), k, v, q_pos), "q must be a torch.Tensor, got list"),
        "k-numpy": ((q, k.numpy(), v, q_pos), "k must be a torch.Tensor, got ndarray"),
        "v-None": ((q, k, None, q_pos), "v must be a torch.Tensor, got NoneType"),
        "q_pos-str": ((q, k, v, "789"), "q_pos must be a tensor .* of integer positions, got str"),
        "q_pos-None": ((q, k, v, None), "q_pos must be a tensor .* got NoneType"),
        "q_pos-ragged": ((q, k, v, [[7, 8], [9]]), "q_pos must be a tensor .* got list"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_bad_shapes_raise(case):
    args, word = _bad_inputs()[case]
    with pytest.raises(ValueError, match=word):
        wmtp.attention(*args, n_sink=2, window=4, impl="torch")


@pytest.mark.parametrize("n_sink, window, name", [(-1, 4, "n_sink"), (2, 0, "window"), (2, 2.5, "window"),
                                                  (2**63, 4, "n_sink"), (2, 2**64 - 1, "window"), (2**70, 4, "n_sink")])
def test_bad_key_set_args_raise(n_sink, window, name):
    """A key set past int64 (2**63, 2**64 - 1) was read wrapped, the output silently not the formula's;
    2**70 was torch's OverflowError."""
    q, k, v, q_pos = make_inputs(1, 2, 1, 1, 10, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match=name):
        wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl="torch")


def test_query_blocks_split_at_gaps_and_every_256_queries():
    """Literal blocks: consecutive positions together, at most BLOCK_Q = 256 of them (the score tile's bound);
    a gap, or positions out of order, starts a new block."""
    assert _query_blocks(torch.arange(600)) == [(0, 256), (256, 512), (512, 600)]
    assert _query_blocks(torch.tensor([0, 1, 2, 5, 6, 9])) == [(0, 3), (3, 5), (5, 6)]
    assert _query_blocks(torch.tensor([7, 3, 4])) == [(0, 1), (1, 3)]
    assert _query_blocks(torch.tensor([4])) == [(0, 1)]


def test_no_queries_give_an_empty_output_contiguous_or_paged():
    q, k, v, _ = make_inputs(1, 4, 2, 1, 8, 16, torch.float32, seed=0)
    q, none = q[:, :, :0], torch.zeros(0, dtype=torch.long)  # (1, 4, 0, 16), no positions
    k_pages, v_pages, table = paginate(k, v, 4, torch.Generator().manual_seed(0))
    assert wmtp.attention(q, k, v, none, 1, 2, impl="torch").shape == (1, 4, 0, 16)
    assert wmtp.paged_attention(q, k_pages, v_pages, table, none, 1, 2, impl="torch").shape == (1, 4, 0, 16)


def test_paged_queries_out_of_order_read_up_to_the_largest_position():
    """Positions [7, 3]: the paged reference reads keys up to 7 (the largest, not the last), as the contiguous one."""
    q, k, v, _ = make_inputs(1, 4, 2, 2, 8, 16, torch.float64, seed=1)
    pos = torch.tensor([7, 3])
    k_pages, v_pages, table = paginate(k, v, 4, torch.Generator().manual_seed(1))
    for n_sink, window in [(None, None), (1, 3)]:
        want = wmtp.attention(q, k, v, pos, n_sink, window, impl="torch")
        got = wmtp.paged_attention(q, k_pages, v_pages, table, pos, n_sink, window, impl="torch")
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
