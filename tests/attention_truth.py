"""Shared by the attention tests: seeded inputs, the float64 ground truth, and THE tolerances.

Ground truth is computed here, independently of wmtp/attention: dense float64 scores over ALL
``S`` keys, the key set of ``draft_key_mask`` (checked with literal lists in tests/test_keyset.py),
``-inf`` elsewhere, softmax, and GQA by ``repeat_interleave`` of the k/v heads.

NOTE [Tolerances] (STYLE.md lesson 6), the one statement of them. Inputs are rounded to the dtype
before the truth is computed, so only an op's own arithmetic is measured.
- The reference (``assert_reference_close``): an element passes if ``|out - truth| <= ATOL +
  RTOL * |truth|`` and the whole output if ``||out - truth|| / ||truth|| <= REL_RMS``.
  float64: only summation order differs from the truth. float32: fp32 dot products (D <= 256)
  and a softmax over <= 5000 keys, a few ulps of O(1). float16 / bfloat16: the reference computes
  in fp32 (error <= the fp32 ATOL) and rounds the output once (at most eps/2 * |x|), so RTOL =
  2 * eps(dtype), ATOL = the fp32 floor (it also covers fp16 subnormals), REL_RMS = eps(dtype).
- A kernel (``assert_kernel_close``, the flash-attn rule; an output equal to the reference's gets the
  reference rule): the reference run in the same low
  precision sets the scale of honest error; the kernel sums in another order, folds log2(e) into
  the scale, and for fp16/bf16 rounds the probabilities before the PV product, so
      max|out - truth| <= ERR_FACTOR * max|ref - truth| + ATOL[dtype] + eps(dtype) (fp16/bf16)
      rms(out - truth) / rms(truth) <= ERR_FACTOR * (same for ref) + REL_RMS[dtype]
"""

import math

import torch

from wmtp.attention.reference import attention_torch
from wmtp.keyset import draft_key_mask

ATOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5}
RTOL = {torch.float64: 0.0, torch.float32: 0.0,
        torch.float16: 2 * torch.finfo(torch.float16).eps, torch.bfloat16: 2 * torch.finfo(torch.bfloat16).eps}
REL_RMS = {torch.float64: 1e-13, torch.float32: 1e-6,
           torch.float16: torch.finfo(torch.float16).eps, torch.bfloat16: torch.finfo(torch.bfloat16).eps}
ERR_FACTOR = 2.0


def dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


def make_inputs(B, Hq, Hkv, Lq, S, D, dtype, seed, q_pos=None, device="cpu"):
    """Seeded ``q (B, Hq, Lq, D)``, ``k, v (B, Hkv, S, D)`` and ``q_pos (Lq,)`` (default: the last Lq).

    Values are drawn in float64 and then rounded, so every dtype sees the same numbers.
    """
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)

    q_pos = torch.arange(S - Lq, S) if q_pos is None else torch.as_tensor(q_pos)
    return randn(B, Hq, Lq, D), randn(B, Hkv, S, D), randn(B, Hkv, S, D), q_pos.to(device)


def truth(q, k, v, q_pos, n_sink, window, q_sink=None):
    """Dense float64 attention over all S keys, masked by the key set (on the inputs' device);
    with ``q_sink``, the sink columns (``j < n_sink``) are scored by it (re-indexed positions)."""
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, Hq, S, D): query head h reads kv head h // group
    v = v.repeat_interleave(group, dim=1)  # (B, Hq, S, D)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, Hq, Lq, S)
    if q_sink is not None:
        sinks = min(n_sink or 0, k.shape[2])
        scores[..., :sinks] = (q_sink.to(torch.float64) @ k[:, :, :sinks].transpose(-1, -2)) / math.sqrt(q.shape[-1])
    allowed = draft_key_mask(q_pos.cpu(), k.shape[2], n_sink, window).to(q.device)  # (Lq, S)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, Hq, Lq, D)


def _finite(out, dtype, shape):
    assert out.dtype == dtype and out.shape == shape
    assert torch.isfinite(out).all(), "output has non-finite values"


def assert_reference_close(out, expected, dtype):
    """The reference rule of NOTE [Tolerances]: ``out`` against a float64 ``expected``."""
    _finite(out, dtype, expected.shape)
    err = (out.to(torch.float64) - expected).abs()
    bound = ATOL[dtype] + RTOL[dtype] * expected.abs()
    excess = (err - bound).max().item()
    assert excess <= 0, f"max abs err {err.max().item():.3g} exceeds bound by {excess:.3g} ({dtype})"
    rel_rms = (err.norm() / expected.norm()).item()
    assert rel_rms <= REL_RMS[dtype], f"relative RMS {rel_rms:.3g} > {REL_RMS[dtype]:.3g} ({dtype})"


def assert_kernel_close(out, q, k, v, q_pos, n_sink, window, q_sink=None):
    """The kernel rule of NOTE [Tolerances]: at most twice the low-precision reference's own error.
    An ``out`` that is the reference's bit for bit (``impl="torch"`` in the parametrized tests) is held
    to the reference rule instead: the kernel rule, scaled by that same output's error, could not fail
    (a reference that ignored ``q_sink`` or scaled by the wrong power of D passed it)."""
    _finite(out, q.dtype, q.shape)
    assert out.device == q.device
    expected = truth(q, k, v, q_pos, n_sink, window, q_sink)
    ref = attention_torch(q, k, v, q_pos, n_sink, window, q_sink)
    if torch.equal(out, ref):
        assert_reference_close(out, expected, q.dtype)
    else:
        assert_op_close(out, ref, expected)


def assert_op_close(out, ref, expected):
    """The kernel rule of NOTE [Tolerances] for any op: ``out`` (the kernel's) against ``expected``
    (float64 truth), scaled by ``ref`` (the reference run in ``out``'s dtype)."""
    dtype = out.dtype
    ref_err = ref.to(torch.float64) - expected
    err = out.to(torch.float64) - expected
    floor = ATOL[dtype] + (torch.finfo(dtype).eps if dtype in (torch.float16, torch.bfloat16) else 0.0)
    bound = ERR_FACTOR * ref_err.abs().max().item() + floor
    assert err.abs().max().item() <= bound, f"max abs err {err.abs().max().item():.3g} > {bound:.3g} ({dtype})"
    rms, ref_rms = (err.norm() / expected.norm()).item(), (ref_err.norm() / expected.norm()).item()
    rms_bound = ERR_FACTOR * ref_rms + REL_RMS[dtype]
    assert rms <= rms_bound, f"relative RMS {rms:.3g} > {rms_bound:.3g} ({dtype})"
