"""Re-indexed (StreamingLLM) positions for the draft's keys (wmtp/keyset.py, DESIGN.md).

The definition: inside the key set of a query at ``t``, the i-th key sits at position ``i`` and
the query at the last index (``reindexed_key_positions``). wmtp never builds that compact cache:
it scores the sinks with the query rotated to ``sink_query_position(t)`` (the ops' ``q_sink``).
Tested here: both functions against literal values; the ops with ``q_sink`` against the
definition, computed from unrotated keys in a compact float64 cache, for both impls and the
contiguous and paged layouts; the kernel against the reference in low precision (the tolerance
rule of tests/attention_truth.py); the head and the decoders with ``positions="reindexed"``
(the same as absolute until the key set evicts, different after, lossless always).
"""

import copy
import math
import os

import pytest
import torch
from attention_truth import assert_kernel_close, dtype_id, make_inputs
from decode_harness import LogitsRecorder, random_prompt, same_counts, same_drafts

import wmtp
from wmtp.attention import paged_attention
from wmtp.attention.paged import paginate
from wmtp.block import apply_rope
from wmtp.grading import harness_models
from wmtp.keyset import draft_key_indices, reindexed_key_positions, sink_query_position

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TRITON = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not TRITON, reason="needs CUDA or the interpreter"))]
CUDA_ONLY = pytest.mark.skipif(not CUDA, reason="needs CUDA (bfloat16, large shapes, the GPU backends)")
THETA = 10000.0


@pytest.mark.parametrize("t, n_sink, window, keys, query", [
    (19, 2, 6, [0, 1, 2, 3, 4, 5, 6, 7], 7),  # keys [0, 1, 14..19]
    (7, 4, 6, [0, 1, 2, 3, 4, 5, 6, 7], 7),  # nothing evicted yet: positions are the absolute ones
    (3, 8, 4, [0, 1, 2, 3], 3),
    (9, 0, 4, [0, 1, 2, 3], 3),  # keys [6..9]
])
def test_reindexed_key_positions_literal(t, n_sink, window, keys, query):
    got_keys, got_query = reindexed_key_positions(t, n_sink, window)
    assert got_keys.tolist() == keys and got_query == query


@pytest.mark.parametrize("t, n_sink, window, expected", [
    (19, 2, 6, 7), (10, 4, 6, 9), (9, 4, 6, 9), (7, 4, 6, 7), (0, 4, 6, 0),
    (100, 0, 6, 100),  # no sinks: nothing moves
    (100, 4, None, 100),  # the full causal set: nothing is evicted
])
def test_sink_query_position_literal(t, n_sink, window, expected):
    assert sink_query_position(t, n_sink, window) == expected


def test_sink_query_position_on_tensors():
    assert sink_query_position(torch.tensor([5, 9, 10, 50]), 4, 6).tolist() == [5, 9, 9, 9]
    with pytest.raises(ValueError, match="position"):
        sink_query_position(-1, 4, 6)


def streaming_truth(q_raw, k_raw, v, q_pos, n_sink, window):
    """The definition, query by query: gather the key set into a compact float64 cache, rotate its
    keys to their index in it and the query to the last index, attend (GQA by repeat)."""
    B, Hq, Lq, D = q_raw.shape
    group = Hq // k_raw.shape[1]
    out = torch.empty(B, Hq, Lq, D, dtype=torch.float64)
    for i, t in enumerate(q_pos.tolist()):
        idx = draft_key_indices(t, n_sink, window)
        key_pos, query_pos = reindexed_key_positions(t, n_sink, window)
        k = apply_rope(k_raw[:, :, idx].double(), key_pos, THETA).repeat_interleave(group, 1)  # (B, Hq, n, D)
        q = apply_rope(q_raw[:, :, i:i + 1].double(), torch.tensor([query_pos]), THETA)  # (B, Hq, 1, D)
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), dim=-1)  # (B, Hq, 1, n)
        out[:, :, i:i + 1] = p @ v[:, :, idx].double().repeat_interleave(group, 1)
    return out


def rotated(q_raw, k_raw, q_pos, n_sink, window):
    """What the model hands the ops: q and k at their absolute positions, q_sink at sink_query_position."""
    S = k_raw.shape[2]
    q = apply_rope(q_raw, q_pos, THETA)  # (B, Hq, Lq, D)
    k = apply_rope(k_raw, torch.arange(S, device=k_raw.device), THETA)  # (B, Hkv, S, D)
    return q, k, apply_rope(q_raw, sink_query_position(q_pos, n_sink, window), THETA)


def run_op(impl, layout, q, k, v, q_pos, n_sink, window, q_sink):
    if layout == "contiguous":
        return wmtp.attention(q, k, v, q_pos, n_sink, window, impl, q_sink=q_sink)
    k_pages, v_pages, table = paginate(k, v, int(layout.removeprefix("paged")), torch.Generator().manual_seed(3))
    return paged_attention(q, k_pages, v_pages, table, q_pos, n_sink, window, impl, q_sink=q_sink)


# (Hq, Hkv, q_pos, S, n_sink, window): evicting, straddling the first eviction, nothing evicted yet
CASES = [
    pytest.param(4, 2, [60], 61, 4, 8, id="decode-evicting"),
    pytest.param(4, 1, list(range(8, 16)), 40, 4, 6, id="queries-straddle-ns+w"),
    pytest.param(2, 2, [3, 4, 5], 6, 4, 8, id="nothing-evicted"),
    pytest.param(4, 2, [30, 31], 32, 1, 1, id="one-sink-window1"),
    pytest.param(4, 2, [12, 40, 41], 50, 3, 5, id="scattered-queries"),
    pytest.param(4, 1, list(range(40, 60)), 61, 4, 8, id="chunked-20-queries"),  # 80 tile rows: 2 chunks, one launch
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["contiguous", "paged1", "paged16"])
@pytest.mark.parametrize("Hq, Hkv, q_pos, S, n_sink, window", CASES)
def test_q_sink_is_attention_at_reindexed_positions(Hq, Hkv, q_pos, S, n_sink, window, layout, impl):
    q_raw, k_raw, v, pos = make_inputs(1, Hq, Hkv, len(q_pos), S, 32, torch.float64, seed=S, q_pos=q_pos)
    q, k, q_sink = rotated(q_raw, k_raw, pos, n_sink, window)
    out = run_op(impl, layout, q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), pos.to(DEVICE), n_sink, window,
                 q_sink.to(DEVICE))
    torch.testing.assert_close(out.cpu(), streaming_truth(q_raw, k_raw, v, pos, n_sink, window), rtol=0, atol=1e-10)
    absolute = run_op(impl, layout, q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), pos.to(DEVICE), n_sink, window, None)
    evicted = max(q_pos) >= n_sink + window  # some sink's distance moved
    assert (out - absolute).abs().max().item() > 1e-6 if evicted else torch.allclose(out, absolute, atol=1e-12)


DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=CUDA_ONLY)]
# (Hq, Hkv, Lq, S, D, n_sink, window); the last Lq positions
KERNEL_CASES = [
    pytest.param(4, 1, 1, 133, 32, 4, 16, id="decode-S133"),
    pytest.param(8, 2, 8, 100, 64, 8, 16, id="verify-S100"),
    pytest.param(32, 8, 1, 20000, 128, 64, 4096, id="draft-S20000-splits", marks=CUDA_ONLY),
    pytest.param(16, 2, 8, 9000, 256, 64, 4096, id="draft-Lq8-D256", marks=CUDA_ONLY),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("Hq, Hkv, Lq, S, D, n_sink, window", KERNEL_CASES)
def test_q_sink_in_low_precision(Hq, Hkv, Lq, S, D, n_sink, window, dtype, layout, impl):
    """The tolerance rule of tests/attention_truth.py, with the sinks scored by a second query."""
    q, k, v, q_pos = make_inputs(1, Hq, Hkv, Lq, S, D, dtype, seed=D + Lq, device=DEVICE)
    q_sink = make_inputs(1, Hq, Hkv, Lq, 1, D, dtype, seed=D + Lq + 1, device=DEVICE)[0]
    out = run_op(impl, layout, q, k, v, q_pos, n_sink, window, q_sink)
    assert_kernel_close(out, q, k, v, q_pos, n_sink, window, q_sink=q_sink)


@pytest.mark.skipif(not TRITON, reason="needs CUDA or the interpreter")
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
@pytest.mark.parametrize("q_pos", [[99], [97, 98, 99]])
def test_q_sink_over_many_sink_blocks_and_splits(q_pos, layout):
    """Blocks of 16 keys: 40 sinks are two unmasked blocks and a masked one, split over 3 programs
    (the interpreter's default is one split and 64-key blocks, which hide an unmasked sink block)."""
    from wmtp.attention.reference import attention_torch
    from wmtp.attention.triton_attention import attention_triton, paged_attention_triton

    q, k, v, pos = make_inputs(1, 4, 2, len(q_pos), 100, 32, torch.float64, seed=7, q_pos=q_pos, device=DEVICE)
    q_sink = make_inputs(1, 4, 2, len(q_pos), 1, 32, torch.float64, seed=8, device=DEVICE)[0]
    expected = attention_torch(q, k, v, pos, 40, 16, q_sink)
    if layout == "contiguous":
        out = attention_triton(q, k, v, pos, 40, 16, block_n=16, num_splits=3, q_sink=q_sink)
    else:
        k_pages, v_pages, table = paginate(k, v, 16, torch.Generator(device=DEVICE).manual_seed(1))
        out = paged_attention_triton(q, k_pages, v_pages, table, pos, 40, 16, block_n=16, num_splits=3, q_sink=q_sink)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_q_sink_layouts_and_grads():
    """A q_sink whose strides differ from q's only on a size-1 dimension, and a q_sink that requires grad."""
    q, k, v, pos = make_inputs(1, 4, 2, 1, 40, 32, torch.float64, seed=2, device=DEVICE)
    q_sink = torch.randn(1, 1, 4, 32, dtype=torch.float64, device=DEVICE).transpose(1, 2)  # (1, 4, 1, 32), odd strides
    assert q_sink.stride() != q.stride()
    expected = wmtp.attention(q, k, v, pos, 4, 8, "torch", q_sink=q_sink)
    if TRITON:
        torch.testing.assert_close(wmtp.attention(q, k, v, pos, 4, 8, "triton", q_sink=q_sink), expected, rtol=0,
                                   atol=1e-12)
        with pytest.raises(ValueError, match="require grad"):
            wmtp.attention(q, k, v, pos, 4, 8, "triton", q_sink=q_sink.clone().requires_grad_())


def test_bad_q_sink_raises():
    q, k, v, q_pos = make_inputs(1, 4, 2, 1, 20, 32, torch.float64, seed=0)
    with pytest.raises(ValueError, match="window=None"):
        wmtp.attention(q, k, v, q_pos, 4, None, "torch", q_sink=q)
    with pytest.raises(ValueError, match="q_sink must match q"):
        wmtp.attention(q, k, v, q_pos, 4, 8, "torch", q_sink=q[:, :2])
    with pytest.raises(ValueError, match="q_sink must match q"):
        wmtp.attention(q, k, v, q_pos, 4, 8, "torch", q_sink=q.float())


@pytest.fixture(scope="module")
def models():
    return harness_models()


def test_the_head_reindexes_only_once_the_key_set_evicts(models):
    """Logits of one extend over positions 0..39 with (4, 8): equal to absolute positions while
    ``t < n_sink + window`` (nothing evicted), different after."""
    target, head = models
    prompt = random_prompt(41)
    _, hidden = target(prompt[None])
    pos = torch.arange(40)
    runs = {}
    for positions in ("absolute", "reindexed"):
        cache = head.new_cache(max_len=64)
        runs[positions], _ = head(hidden[:, :40], prompt[None, 1:], pos, cache, 4, 8, "torch", positions)
    before = slice(0, 12)  # t <= n_sink + window - 1 = 11
    torch.testing.assert_close(runs["reindexed"][:, before], runs["absolute"][:, before], rtol=0, atol=1e-12)
    assert (runs["reindexed"][:, 12:] - runs["absolute"][:, 12:]).abs().amax(-1).min() > 0  # every later row moves
    native = [head(hidden[:, :40], prompt[None, 1:], pos, head.new_cache(max_len=64), 4, None, "torch", p)[0]
              for p in ("absolute", "reindexed")]
    assert torch.equal(*native)  # nothing to re-index in the full causal set


@pytest.mark.parametrize("draft_cache", ["full", "ring"])
@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("n_sink, window", [(4, 8), (1, 3), (2, 40)])
def test_reindexed_decoding_is_lossless(models, n_sink, window, depth, draft_cache):
    target, head = models
    prompt = random_prompt(30, seed=depth)
    ref = wmtp.greedy_generate(target, prompt, 24)
    out, stats = wmtp.speculative_generate(target, head, prompt, 24, depth, n_sink, window, draft_cache=draft_cache,
                                           positions="reindexed")
    assert torch.equal(out, ref)
    sampled, _ = wmtp.speculative_sample(target, head, prompt, 24, depth, n_sink, window, temperature=0.8, seed=5,
                                         method="gumbel", draft_cache=draft_cache, positions="reindexed")
    assert torch.equal(sampled, wmtp.sample_generate(target, prompt, 24, temperature=0.8, seed=5))
    static, static_stats = wmtp.static_speculative_generate(target, head, prompt, 24, depth, n_sink, window,
                                                            draft_cache=draft_cache, positions="reindexed")
    assert torch.equal(static, ref)
    same_counts(static_stats, stats)  # the device-resident loop drafts what the eager loop drafts


def test_native_draft_ignores_reindexing(models):
    target, head = models
    prompt = random_prompt(20)
    runs = [wmtp.speculative_generate(target, head, prompt, 16, 3, None, None, positions=p)
            for p in ("absolute", "reindexed")]
    assert torch.equal(runs[0][0], runs[1][0])
    same_counts(runs[0][1], runs[1][1])


def test_a_head_without_rope_ignores_reindexing(models):
    """A NoPE head (``MTPConfig(rope=False)``) has no positions to re-index: a windowed draft with
    ``positions="reindexed"`` runs, and drafts exactly as with absolute positions (mutation round 4:
    re-indexing without the RoPE check survived every test; it fails on the missing frequencies)."""
    target, _ = models
    head = wmtp.MTPHead(wmtp.MTPConfig(rope=False), target).double()
    prompt = random_prompt(30)
    recorders = LogitsRecorder(head), LogitsRecorder(head)
    runs = [wmtp.speculative_generate(target, rec, prompt, 16, 3, 2, 6, positions=p)
            for rec, p in zip(recorders, ("absolute", "reindexed"))]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][0], wmtp.greedy_generate(target, prompt, 16))
    same_counts(runs[0][1], runs[1][1])
    same_drafts(*recorders)  # the untrained head accepts nothing: its logits tell
    # and it is a head without RoPE: the same weights with RoPE draft other logits (a head built with RoPE
    # whatever its config said survived every test, session 54)
    roped = wmtp.MTPHead(wmtp.MTPConfig(rope=True), target).double()
    roped.load_state_dict(head.state_dict())
    with_rope = LogitsRecorder(roped)
    wmtp.speculative_generate(target, with_rope, prompt, 16, 3, 2, 6)
    assert len(with_rope.logits) == len(recorders[0].logits)
    assert not all(torch.allclose(a, b) for a, b in zip(with_rope.logits, recorders[0].logits))


@pytest.mark.parametrize("generate", ["speculative_generate", "static_speculative_generate", "speculative_sample"])
def test_unknown_positions_raise(models, generate):
    target, head = models
    kwargs = dict(temperature=1.0) if generate == "speculative_sample" else {}
    with pytest.raises(ValueError, match="unknown positions 'relative'"):
        getattr(wmtp, generate)(target, head, random_prompt(8), 4, 2, 4, 8, positions="relative", **kwargs)


BACKENDS = [pytest.param("cpu", "triton", marks=pytest.mark.skipif(CUDA or not TRITON, reason="needs the interpreter")),
            pytest.param("cuda", "torch", marks=CUDA_ONLY), pytest.param("cuda", "triton", marks=CUDA_ONLY)]


@pytest.mark.parametrize("device, impl", BACKENDS)
@pytest.mark.parametrize("draft_cache", ["full", "ring"])
def test_reindexed_decoding_on_each_backend(models, device, impl, draft_cache):
    """The head's own draft attention (q_sink) on the backend, full cache and ring: lossless, and
    the same drafts as the CPU reference (float64: the accepts agree)."""
    target, head = (m.to(device) for m in copy.deepcopy(models))
    prompt = random_prompt(30, seed=7)
    ref = wmtp.greedy_generate(target, prompt.to(device), 20, impl=impl)
    out, stats = wmtp.speculative_generate(target, head, prompt.to(device), 20, 3, 4, 8, impl=impl,
                                           draft_cache=draft_cache, positions="reindexed")
    assert torch.equal(out, ref)
    _, cpu_stats = wmtp.speculative_generate(*models, prompt, 20, 3, 4, 8, impl="torch", positions="reindexed")
    same_counts(stats, cpu_stats)


@pytest.mark.parametrize("generate", ["speculative_generate", "static_speculative_generate", "speculative_sample"])
@pytest.mark.parametrize("draft_cache", ["full", "ring"])
def test_every_draft_call_reindexes(models, monkeypatch, generate, draft_cache):
    """Spy on the draft's attention: with positions='reindexed' every decoding call of the draft (its
    queries at 29 and later, past the first eviction at n_sink + window = 12) passes q_sink, in the
    extend and the recursive calls alike; with 'absolute' none does. (The prefill's draft call passes
    none either way: its outputs are unused, and the keys it writes do not depend on positions.)"""
    from wmtp.kvcache import KVCache
    from wmtp.ringcache import RingKVCache

    calls = []
    for cls in (KVCache, RingKVCache):
        def spy(self, layer, q, pos, n_sink, window, impl, q_sink=None, real=cls.attend):
            if (n_sink, window) == (4, 8):  # the draft's key set (the target's layers use n_sink 0)
                calls.append((int(pos.min()), int(pos.max()), q_sink is not None))
            return real(self, layer, q, pos, n_sink, window, impl, q_sink)
        monkeypatch.setattr(cls, "attend", spy)
    target, head = models
    kwargs = dict(temperature=0.8, seed=1) if generate == "speculative_sample" else {}
    for positions in ("absolute", "reindexed"):
        calls.clear()
        getattr(wmtp, generate)(target, head, random_prompt(30), 12, 3, 4, 8, draft_cache=draft_cache,
                                positions=positions, **kwargs)
        late = [has for lo, hi, has in calls if lo >= 29]  # decoding's calls, not the prefill's (its outputs unused)
        assert len(late) > 12 and all(late) == (positions == "reindexed") and any(late) == all(late), (positions, calls)


def test_a_draft_without_positions_is_refused_before_any_work(models, monkeypatch):
    from wmtp import grading, prefill

    target, head = models
    monkeypatch.setattr(prefill, "_run_prefill", lambda *a, **k: pytest.fail("prefilled before refusing"))
    oracle = grading.OracleDraft(head, random_prompt(60), 2, 512)
    for generate in (wmtp.speculative_generate, wmtp.static_speculative_generate):
        with pytest.raises(ValueError, match="needs a draft that takes positions="):
            generate(target, oracle, random_prompt(20), 8, 2, 4, 8, positions="reindexed")
