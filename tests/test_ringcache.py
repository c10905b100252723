"""The draft's ring-buffer KV cache (wmtp/ringcache.py): its slot table is ``ring_slot``'s, a head
reading it through the decode protocol gets the logits it gets from the full cache (through
wrap-around, with the fewest spare slots the protocol allows), and decoding with it is lossless."""

import pytest
import torch
from decode_harness import HeadProxy, LogitsRecorder, V, random_prompt, same_counts, same_drafts

import wmtp
from wmtp import grading
from wmtp.grading import harness_models
from wmtp.kvcache import KVCache, ring_slot
from wmtp.ringcache import RingKVCache

CUDA = torch.cuda.is_available()
WINDOWED = [(4, 16), (0, 1), (2, 3), (0, 8)]


@pytest.fixture(scope="module")
def models():
    return harness_models()


def ring(n_sink, window, spare, max_len=64, **kw):
    return RingKVCache(1, 1, 2, 4, n_sink=n_sink, window=window, spare=spare, max_len=max_len,
                       dtype=torch.float64, **kw)


def test_slots_follow_ring_slot():
    r = ring(2, 6, 3, max_len=20)
    assert r.block_table[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert [ring_slot(p, 2, 6, 3) for p in range(20)] == r.block_table[0].tolist()  # ints: the same expression
    assert ring(0, 1, 0, max_len=5).block_table[0].tolist() == [0] * 5  # one slot: every position
    two = RingKVCache(1, 2, 2, 4, n_sink=2, window=6, spare=3, max_len=20)
    assert torch.equal(two.block_table[1], two.block_table[0] + 11)  # the second sequence's own slots
    assert r.nbytes == 2 * 11 * 2 * 4 * 8  # K and V, 11 slots of (Hkv, D) float64
    short = ring(2, 6, 3, max_len=7)  # fewer positions than slots: one slot each, nothing wraps
    assert short.slots == 7 and short.block_table[0].tolist() == list(range(7))


def test_per_row_positions_write_each_row_at_its_own():
    """Positions ``(B, L)``: row 0 writes positions 0, 1 and row 1 positions 12, 13 (slots 2 + 10 % 9 = 3 and 4
    of a ring of (2, 6, 3): 11 slots, the sinks 0, 1 pinned), each into its own sequence's slots."""
    r = RingKVCache(1, 2, 1, 1, n_sink=2, window=6, spare=3, max_len=20, dtype=torch.float64)
    k = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64).view(2, 1, 2, 1)  # (B, Hkv, L, D)
    r.update(0, torch.tensor([[0, 1], [12, 13]]), k, -k)
    assert r.k[0, :, 0, 0, 0].tolist() == [1, 2] + [0] * 9 + [0, 0, 0, 3, 4] + [0] * 6
    assert torch.equal(r.v, -r.k)


def test_attend_equals_the_full_cache_after_sequential_writes():
    """Positions written one call at a time (4 a call: a ring serves at most spare + 1 queries), then
    queries at the last positions: the ring's attention equals the full cache's, while the ring holds
    11 of 40 rows."""
    g = torch.Generator().manual_seed(0)
    full, r = KVCache(1, 1, 2, 40, 4, dtype=torch.float64), ring(2, 6, 3, max_len=40)
    for a in range(0, 40, 4):  # calls of 4 = spare + 1 queries
        pos = torch.arange(a, a + 4)
        k, v = torch.randn(2, 1, 2, 4, 4, generator=g, dtype=torch.float64)
        full.update(0, pos, k, v)
        r.update(0, pos, k, v)
        q = torch.randn(1, 4, 4, 4, generator=g, dtype=torch.float64)  # (B, Hq, L, D): GQA group 2
        for n_sink, window in [(2, 6), (1, 6), (2, 4), (0, 1)]:
            for q_sink in (None, q.flip(-1)):  # absolute, and the sinks scored by other queries (re-indexed)
                torch.testing.assert_close(r.attend(0, q, pos, n_sink, window, "torch", q_sink),
                                           full.attend(0, q, pos, n_sink, window, "torch", q_sink), rtol=0, atol=1e-12)


def test_fill_from_holds_what_sequential_writes_leave():
    g = torch.Generator().manual_seed(1)
    full = KVCache(1, 1, 2, 40, 4, dtype=torch.float64)
    full.update(0, torch.arange(40), *torch.randn(2, 1, 2, 40, 4, generator=g, dtype=torch.float64))
    for length in (1, 2, 7, 11, 12, 29):
        written, filled = ring(2, 6, 3, max_len=40), ring(2, 6, 3, max_len=40)
        for p in range(length):
            written.update(0, torch.tensor([p]), full.k[0][:, :, p:p + 1], full.v[0][:, :, p:p + 1])
        filled.fill_from(full, length)
        assert torch.equal(filled.k, written.k) and torch.equal(filled.v, written.v), length


def test_bad_rings_and_writes_raise(models):
    with pytest.raises(ValueError, match="window=None"):
        ring(2, None, 3)
    with pytest.raises(ValueError, match="spare"):
        ring(2, 6, -1)
    r = ring(2, 6, 3)
    k = torch.zeros(1, 2, 12, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="at most 11 positions a write"):  # 11 slots
        r.update(0, torch.arange(12), k, k)
    r.update(0, torch.arange(11), k[:, :, :11], k[:, :, :11])  # a write alone: one position a slot
    with pytest.raises(ValueError, match="do not fit"):
        r.update(0, torch.tensor([64]), k[:, :, :1], k[:, :, :1])
    with pytest.raises(ValueError, match="at most 4 queries a call"):  # spare + 1: they read after their writes
        r.attend(0, torch.zeros(1, 2, 5, 4, dtype=torch.float64), torch.arange(6, 11), 2, 6, "torch")
    q = torch.zeros(1, 2, 1, 4, dtype=torch.float64)
    for n_sink, window in [(3, 6), (2, 7), (0, None)]:
        with pytest.raises(ValueError, match="needs more"):
            r.attend(0, q, torch.tensor([10]), n_sink, window, "torch")
    head = models[1]
    cache, d = head.new_cache(1, 64, ring=(2, 6, 3)), head.target.config.d_model
    before = cache.copy()
    with pytest.raises(ValueError, match="at most 4 queries a call"):  # refused before the call writes
        head(torch.ones(1, 5, d, dtype=head.proj.dtype), torch.ones(1, 5, dtype=torch.long), torch.arange(5), cache,
             2, 6)
    assert torch.equal(cache.k, before.k) and torch.equal(cache.v, before.v)
    r2 = r.copy()
    r2.update(0, torch.tensor([3]), k[:, :, :1] + 1, k[:, :, :1] + 1)
    assert not torch.equal(r2.k, r.k)  # a copy owns its rows


@pytest.mark.parametrize("rg, P, kept, calls", [
    ((2, 5, 3), 3, [0, 1], [2]),
    ((2, 5, 3), 9, [0, 1, 2, 3, 4, 5, 6, 7], [2, 6]),
    ((2, 5, 3), 11, list(range(10)), [2, 8]),  # P - 1 = the ring's 10 slots
    ((2, 5, 3), 30, [0, 1, *range(21, 29)], [2, 8]),
    ((0, 5, 3), 12, list(range(3, 11)), [8]),  # no sinks
    ((4, 5, 3), 3, [0, 1], [2]),  # fewer positions than sinks
    ((2, 5, 3), 1, [], []),  # a one-token prompt: no chain
])
def test_a_ring_prefill_writes_only_the_positions_it_keeps(models, rg, P, kept, calls):
    """``RingKVCache.kept`` (``rg`` sinks, window and spare slots: the sinks and the last
    ``window + spare`` of the chain's ``P - 1`` positions), written one call a span, and the ring a
    prefill leaves is one written at every position, 4 a call (to float64 rounding: the projections'
    row counts differ): every slot's last write is kept."""
    from wmtp.prefill import _run_prefill

    target, head = models
    assert [p for span in ring(*rg).kept(P - 1) for p in span] == kept
    written, made = [], []

    class Spy(HeadProxy):
        def write_cache(self, hidden, next_ids, pos, cache, impl):
            written.extend(pos.tolist())
            made.append(pos.numel())
            head.write_cache(hidden, next_ids, pos, cache, impl)

    prompt = random_prompt(P, seed=P)
    got = _run_prefill(target, Spy(head), prompt, 40, "torch", True, ring=rg)
    assert sorted(written) == kept and made == calls
    every = head.new_cache(1, 40, ring=rg)
    hidden = target(prompt[None], torch.arange(P), target.new_cache(1, 40))[1]  # (1, P, d): the prefill's
    for a in range(0, P - 1, 4):
        b = min(a + 4, P - 1)
        head.write_cache(hidden[:, a:b], prompt[None, a + 1:b + 1], torch.arange(a, b), every, "torch")
    for mine, theirs in ((got.draft_cache.k, every.k), (got.draft_cache.v, every.v)):  # products of other row counts
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
        assert torch.equal(mine == 0, theirs == 0)  # the same slots written


def drafts_through_the_protocol(head, cache, hidden, tokens, steps, n_sink, window, chunk, impl="torch"):
    """The head driven as decode.py drives it: a prefill of the prompt's true chain, written in calls of
    ``chunk`` positions (``write_cache``), then per step (accepted a, depth k) an extend over the
    positions committed since the last step and k - 1 recursive drafts. Returns every step call's logits."""
    out, n = [], 10  # a prompt of 11 tokens: positions 0..9 are the head's true chain
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        head.write_cache(hidden[:, a:b], tokens[None, a + 1:b + 1], torch.arange(a, b), cache, impl)
    head_start = n - 1 + 1
    for accepted, depth in steps:
        logits, g = head(hidden[:, head_start:n + 1], tokens[None, head_start + 1:n + 2],
                         torch.arange(head_start, n + 1), cache, n_sink, window, impl)
        out.append(logits)
        for i in range(1, depth):  # speculative positions n+1 .. n+depth-1, overwritten later
            logits, g = head(g[:, -1:], torch.tensor([[(7 * i + n) % V]]), torch.tensor([n + i]), cache, n_sink,
                             window, impl)
            out.append(logits)
        head_start, n = n + 1, n + accepted + 1
    return out


@pytest.mark.parametrize("n_sink,window", WINDOWED)
@pytest.mark.parametrize("depth", [1, 3, 8])
def test_the_head_reads_the_same_keys_from_a_ring(models, n_sink, window, depth):
    """Random depths up to ``depth`` (an adaptive policy's) and accept lengths over 60 steps (the
    context passes the ring many times over, with the fewest spare slots the protocol allows:
    spare = the largest depth): every head call's logits equal the full cache's, to 1e-12."""
    target, head = models
    g = torch.Generator().manual_seed(depth)
    ks = [depth] * 20 + torch.randint(1, depth + 1, (40,), generator=g).tolist()  # fixed, then varying
    steps = [(int(torch.randint(0, k + 1, (1,), generator=g)), k) for k in ks]
    N = 11 + sum(a + 1 for a, _ in steps) + depth + 2
    hidden = torch.randn(1, N, target.config.d_model, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (N,), generator=g)
    full = drafts_through_the_protocol(head, head.new_cache(1, N), hidden, tokens, steps, n_sink, window, 10)
    small = head.new_cache(1, N, ring=(n_sink, window, depth))
    assert small.slots == n_sink + window + depth < N / 4
    rung = drafts_through_the_protocol(head, small, hidden, tokens, steps, n_sink, window, depth + 1)
    assert len(full) == len(rung) == sum(k for _, k in steps)
    for i, (a, b) in enumerate(zip(full, rung)):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12, msg=f"call {i}")


@pytest.mark.parametrize("n_sink,window", WINDOWED)
def test_decoding_with_a_ring_is_lossless(models, n_sink, window):
    """Greedy and gumbel-sampled decoding with the ring equal dense decoding and the full-cache run
    (same accepts), for the random head and an oracle right for 2 tokens a step; the ring holds
    ``n_sink + window + depth`` slots, so a 60-token run wraps it."""
    target, head = models
    c = target.config
    slot_bytes = 2 * c.n_kv_heads * c.head_dim * head.proj.element_size()  # K and V of a slot
    prompt = random_prompt(21, seed=window)
    ref = wmtp.greedy_generate(target, prompt, 60)
    seq = torch.cat([prompt, ref, torch.zeros(10, dtype=torch.long)])
    for depth in (1, 3):
        for draft in (head, grading.OracleDraft(head, seq, 2, V)):
            full, full_stats = wmtp.speculative_generate(target, draft, prompt, 60, depth, n_sink, window)
            out, stats = wmtp.speculative_generate(target, draft, prompt, 60, depth, n_sink, window,
                                                   draft_cache="ring")
            assert torch.equal(out, ref) and torch.equal(full, ref)
            same_counts(stats, full_stats)
            assert stats.draft_kv_bytes == (n_sink + window + depth) * slot_bytes < full_stats.draft_kv_bytes
    sampled = wmtp.sample_generate(target, prompt, 40, 0.9, seed=2)
    out, _ = wmtp.speculative_sample(target, head, prompt, 40, 3, n_sink, window, temperature=0.9, seed=2,
                                     method="gumbel", draft_cache="ring")
    assert torch.equal(out, sampled)


@pytest.mark.parametrize("n_sink,window", WINDOWED)
@pytest.mark.parametrize("depth", [1, 3, 8])
def test_the_static_loop_reads_the_same_keys_from_a_ring(models, n_sink, window, depth):
    """The device-resident loop's extend writes depth + 1 rows a step, most of them speculative: with
    a ring of depth spare slots its head calls get the full cache's logits (1e-12), and the tokens
    are dense decoding's."""
    target, head = models
    prompt = random_prompt(21, seed=depth)
    ref = wmtp.greedy_generate(target, prompt, 50)
    runs = {}
    for cache in ("full", "ring"):
        rec = LogitsRecorder(head)
        out, stats = wmtp.static_speculative_generate(target, rec, prompt, 50, depth, n_sink, window,
                                                      draft_cache=cache)
        assert torch.equal(out, ref)
        runs[cache] = rec, stats
    (full, full_stats), (ring, ring_stats) = runs["full"], runs["ring"]
    same_counts(ring_stats, full_stats)
    c = target.config
    slot_bytes = 2 * c.n_kv_heads * c.head_dim * head.proj.element_size()  # K and V of a slot
    # the ring's size, as the eager loop's (a static count of the keys alone survived, session 54)
    assert ring_stats.draft_kv_bytes == (n_sink + window + depth) * slot_bytes < full_stats.draft_kv_bytes
    same_drafts(full, ring)  # the steps' calls (the prefills are write_cache's)


def test_a_shared_prefill_fills_the_ring(models):
    """A ring filled from a shared prefill drafts what a ring the run filled itself drafts: the same head
    logits at every call (1e-12). The random head accepts no draft, so equal tokens and counts alone
    could not tell (session 54: filling the ring one position short passed them)."""
    target, head = models
    prompt = random_prompt(30, seed=4)
    recorders = LogitsRecorder(head), LogitsRecorder(head)  # the run alone's head, the shared prefill's
    pre = wmtp.prefill_prompt(target, prompt, 80, draft=recorders[1])  # its write_cache: no logits recorded
    for depth in (1, 4):
        runs = []
        for rec, prefill in zip(recorders, (None, pre)):
            rec.logits = []
            out, stats = wmtp.speculative_generate(target, rec, prompt, 40, depth, 2, 3, draft_cache="ring",
                                                   prefill=prefill)
            runs.append((out, stats))
        (alone, alone_stats), (shared, shared_stats) = runs
        assert torch.equal(alone, shared)
        same_counts(alone_stats, shared_stats)
        same_drafts(*recorders, f"depth {depth}")


@pytest.mark.parametrize("kwargs, match", [({"draft_cache": "paged"}, "unknown draft_cache"),
                                           ({"window": None, "draft_cache": "ring"}, "native draft")])
def test_bad_draft_caches_raise(models, kwargs, match):
    target, head = models
    with pytest.raises(ValueError, match=match):
        wmtp.speculative_generate(target, head, random_prompt(5), 8, 2, **({"n_sink": 2, "window": 4} | kwargs))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_cuda_ring_is_lossless(models, impl):
    import copy

    target, head = (m.to("cuda") for m in copy.deepcopy(models))
    prompt = random_prompt(21, seed=3).cuda()
    ref = wmtp.greedy_generate(target, prompt, 50, impl=impl)
    for n_sink, window in WINDOWED:
        full, full_stats = wmtp.speculative_generate(target, head, prompt, 50, 3, n_sink, window, impl=impl)
        out, stats = wmtp.speculative_generate(target, head, prompt, 50, 3, n_sink, window, impl=impl,
                                               draft_cache="ring")
        assert torch.equal(out, ref) and torch.equal(full, ref)
        same_counts(stats, full_stats)
        for graph in (False, True) if impl == "triton" else (False,):  # the CUDA graphs capture the ring's writes
            out, stats = wmtp.static_speculative_generate(target, head, prompt, 50, 3, n_sink, window, impl=impl,
                                                          cuda_graph=graph, draft_cache="ring")
            assert torch.equal(out, ref), graph
