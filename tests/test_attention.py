"""Tests of the public attention op ``wmtp.attention`` and its PyTorch reference.

Ground truth is computed here, independently of wmtp/attention: dense float64 scores over ALL
``S`` keys, the key set of ``draft_key_mask`` (itself checked with literal lists in
tests/test_keyset.py), ``-inf`` elsewhere, softmax, and GQA by ``repeat_interleave`` of the
k/v heads. A second check compares the full causal case with ``torch`` SDPA. Shapes are
deliberately awkward (STYLE.md lesson 5): cache lengths that are not block multiples, lengths
around ``n_sink + window``, prefills longer than the reference's 256-query block.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import wmtp
from wmtp.attention import resolve_impl
from wmtp.keyset import draft_key_mask

# NOTE [Tolerances] (STYLE.md lesson 6). An element passes if |out - truth| <= ATOL + RTOL*|truth|,
# and the whole output if ||out - truth|| / ||truth|| <= REL_RMS. Inputs are rounded to the dtype
# before the float64 truth is computed, so only the op's own arithmetic is measured.
# - float64: the reference computes in float64; only summation order differs from the truth.
# - float32: fp32 dot products (D <= 128) and a softmax over <= 600 keys: a few fp32 ulps of O(1).
# - float16 / bfloat16: the reference computes in fp32 (error <= the fp32 ATOL) and rounds the
#   output once, which costs at most eps/2 * |x|. Rule: RTOL = 2 * eps(dtype) (4x that bound),
#   ATOL = the fp32 floor (also covers fp16 subnormals, spacing 6e-8), REL_RMS = eps(dtype).
ATOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5}
RTOL = {
    torch.float64: 0.0,
    torch.float32: 0.0,
    torch.float16: 2 * torch.finfo(torch.float16).eps,
    torch.bfloat16: 2 * torch.finfo(torch.bfloat16).eps,
}
REL_RMS = {
    torch.float64: 1e-13,
    torch.float32: 1e-6,
    torch.float16: torch.finfo(torch.float16).eps,
    torch.bfloat16: torch.finfo(torch.bfloat16).eps,
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


def _make_inputs(B, Hq, Hkv, Lq, S, D, dtype, seed, start=None):
    """Seeded ``q (B, Hq, Lq, D)``, ``k, v (B, Hkv, S, D)`` and ``q_pos (Lq,)``.

    Queries sit at ``start .. start + Lq - 1``; by default the last ``Lq`` positions of the cache
    (the decode / verify shape). Values are drawn in float64 and then rounded, so every dtype
    sees the same numbers.
    """
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    start = S - Lq if start is None else start
    q_pos = torch.arange(start, start + Lq)
    return randn(B, Hq, Lq, D), randn(B, Hkv, S, D), randn(B, Hkv, S, D), q_pos


def _truth(q, k, v, q_pos, n_sink, window):
    """Dense float64 attention over all S keys, masked by the key set: the ground truth."""
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, Hq, S, D): query head h reads kv head h // group
    v = v.repeat_interleave(group, dim=1)  # (B, Hq, S, D)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, Hq, Lq, S)
    allowed = draft_key_mask(q_pos, k.shape[2], n_sink, window)  # (Lq, S)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, Hq, Lq, D)


def _assert_close(out, truth, dtype):
    assert out.dtype == dtype and out.shape == truth.shape
    assert torch.isfinite(out).all(), "output has non-finite values"
    err = (out.to(torch.float64) - truth).abs()
    bound = ATOL[dtype] + RTOL[dtype] * truth.abs()
    excess = (err - bound).max().item()
    assert excess <= 0, f"max abs err {err.max().item():.3g} exceeds bound by {excess:.3g} ({dtype})"
    rel_rms = (err.norm() / truth.norm()).item()
    assert rel_rms <= REL_RMS[dtype], f"relative RMS {rel_rms:.3g} > {REL_RMS[dtype]:.3g} ({dtype})"


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
]


@pytest.mark.parametrize("impl", ["torch", "auto"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("B, Hq, Hkv, Lq, S, D, n_sink, window", SHAPES)
def test_matches_float64_truth(B, Hq, Hkv, Lq, S, D, n_sink, window, dtype, impl):
    q, k, v, q_pos = _make_inputs(B, Hq, Hkv, Lq, S, D, dtype, seed=S + Lq)
    out = wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl=impl)
    _assert_close(out, _truth(q, k, v, q_pos, n_sink, window), dtype)


def test_window1_nosink_returns_own_value():
    q, k, v, q_pos = _make_inputs(1, 4, 2, 5, 20, 32, torch.float64, seed=1)
    out = wmtp.attention(q, k, v, q_pos, n_sink=0, window=1, impl="torch")
    own = v.repeat_interleave(2, dim=1)[:, :, q_pos]  # (B, Hq, Lq, D)
    torch.testing.assert_close(out, own, atol=ATOL[torch.float64], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=_dtype_id)
@pytest.mark.parametrize("S, Hq, Hkv", [(37, 1, 1), (300, 8, 2)])
def test_full_causal_matches_sdpa(S, Hq, Hkv, dtype):
    """window=None and q_pos=arange(S) is plain causal attention: compare with SDPA in float64."""
    q, k, v, _ = _make_inputs(1, Hq, Hkv, S, S, 64, dtype, seed=7)
    out = wmtp.attention(q, k, v, torch.arange(S), n_sink=None, window=None, impl="torch")
    q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
    sdpa = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, enable_gqa=Hq != Hkv)
    _assert_close(out, sdpa, dtype)


# (Lq, S, start, n_sink, window): queries mid-cache, keys after them hold garbage.
MID_CACHE = [
    pytest.param(8, 100, 40, 4, 16, id="verify-window"),
    pytest.param(1, 100, 57, 0, 5, id="decode-nosink"),
    pytest.param(8, 100, 40, None, None, id="verify-full"),
    pytest.param(300, 400, 0, 0, 32, id="prefill-L300"),
]


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
@pytest.mark.parametrize("Lq, S, start, n_sink, window", MID_CACHE)
def test_future_keys_are_never_read(Lq, S, start, n_sink, window, dtype, fill):
    q, k, v, q_pos = _make_inputs(1, 4, 2, Lq, S, 32, dtype, seed=3, start=start)
    assert int(q_pos.max()) + 1 < S
    clean = wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl="torch")
    value = torch.finfo(dtype).max if fill == "max" else fill
    k2, v2 = k.clone(), v.clone()
    k2[:, :, int(q_pos.max()) + 1 :] = value
    v2[:, :, int(q_pos.max()) + 1 :] = value
    out = wmtp.attention(q, k2, v2, q_pos, n_sink=n_sink, window=window, impl="torch")
    assert torch.isfinite(out).all()
    assert torch.equal(out, clean)
    _assert_close(out, _truth(q, k, v, q_pos, n_sink, window), dtype)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=_dtype_id)
@pytest.mark.parametrize("Lq, S, n_sink, window, positions", NAN_CASES)
def test_reads_only_the_key_set(Lq, S, n_sink, window, positions, dtype):
    """NaN anywhere outside every query's key set must not reach the output."""
    q, k, v, q_pos = _make_inputs(2, 4, 2, Lq, S, 32, dtype, seed=11)
    if positions is not None:
        q_pos = torch.tensor(positions)
    clean = wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl="torch")
    k_nan, v_nan, n_poisoned = _nan_outside_key_sets(k, v, q_pos, n_sink, window)
    assert n_poisoned > 0  # the case must actually poison something
    out = wmtp.attention(q, k_nan, v_nan, q_pos, n_sink=n_sink, window=window, impl="torch")
    assert torch.isfinite(out).all(), f"NaN leaked into queries {(~torch.isfinite(out)).any(-1).nonzero().tolist()}"
    assert torch.equal(out, clean)


def test_impl_switch(monkeypatch):
    """No silent fallback: triton off CUDA (and without the interpreter) raises."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_impl("auto", "cpu") == "torch"
    assert resolve_impl("torch", "cpu") == "torch"
    q, k, v, q_pos = _make_inputs(1, 2, 1, 1, 10, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="triton"):
        wmtp.attention(q, k, v, q_pos, n_sink=2, window=4, impl="triton")
    with pytest.raises(ValueError, match="triton"):
        resolve_impl("triton", "cpu")
    with pytest.raises(ValueError, match="unknown"):
        wmtp.attention(q, k, v, q_pos, impl="flash")
    with pytest.raises(ValueError, match="unknown"):
        resolve_impl("flash", "cpu")


def _bad_inputs():
    q, k, v, q_pos = _make_inputs(1, 4, 2, 3, 10, 16, torch.float32, seed=0)
    return {
        "q_pos-too-long": ((q, k, v, torch.arange(4)), "q_pos"),
        "q_pos-too-short": ((q, k, v, torch.arange(2)), "q_pos"),
        "q_pos>=S": ((q, k, v, torch.tensor([7, 8, 10])), "positions"),
        "q_pos<0": ((q, k, v, torch.tensor([-1, 0, 1])), "positions"),
        "Hq%Hkv": ((q[:, :3], k, v, q_pos), "Hq"),
        "head_dim": ((q, k[..., :8], v[..., :8], q_pos), "head_dim"),
        "batch": ((q, torch.cat([k, k]), torch.cat([v, v]), q_pos), "batch"),
        "k!=v": ((q, k, v[:, :, :9], q_pos), "expected"),
        "3-D": ((q[0], k[0], v[0], q_pos), "expected"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_bad_shapes_raise(case):
    args, word = _bad_inputs()[case]
    with pytest.raises(ValueError, match=word):
        wmtp.attention(*args, n_sink=2, window=4, impl="torch")


@pytest.mark.parametrize("n_sink, window, name", [(-1, 4, "n_sink"), (2, 0, "window"), (2, 2.5, "window")])
def test_bad_key_set_args_raise(n_sink, window, name):
    q, k, v, q_pos = _make_inputs(1, 2, 1, 1, 10, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match=name):
        wmtp.attention(q, k, v, q_pos, n_sink=n_sink, window=window, impl="torch")
