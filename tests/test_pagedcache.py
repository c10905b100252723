"""The paged KV cache for decoding (wmtp/pagedcache.py) and the paged reference's view
(wmtp/attention/paged.py ``PagedView``): where a position lives (literal pages and rows), reads and
attention equal the contiguous cache's for both impls, and decoding from a paged prefill is lossless
with the contiguous run's accepts, for every decoder."""

import copy
import os

import pytest
import torch
from decode_harness import LogitsRecorder, V, random_prompt, same_counts, same_drafts

import wmtp
from wmtp import grading
from wmtp.attention.paged import PagedView, paginate
from wmtp.grading import harness_models
from wmtp.kvcache import KVCache
from wmtp.pagedcache import PagedKVCache
from wmtp.prefill import prefill_prompt
from wmtp.ringcache import RingKVCache

CUDA = torch.cuda.is_available()
TRITON = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not TRITON, reason="needs CUDA or the interpreter"))]


def paged(page_size, max_len=10, **kw):
    return PagedKVCache(1, 1, 2, max_len, 4, page_size=page_size, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(5), **kw)


def test_a_position_lives_at_its_page_and_row():
    c = paged(4)  # 10 positions: 3 pages, a spare and a scratch page (NOTE [Forks])
    assert c.k.shape == (1, 5, 4, 2, 4) and sorted(c.block_table[0].tolist() + c._order[3:]) == [0, 1, 2, 3, 4]
    k = torch.arange(10, dtype=torch.float64).view(1, 1, 10, 1).expand(1, 2, 10, 4)  # key p holds p
    c.update(0, torch.arange(10), k, -k)
    table = c.block_table[0].tolist()
    for p in range(10):
        assert c.k[0, table[p // 4], p % 4].eq(p).all() and c.v[0, table[p // 4], p % 4].eq(-p).all()
    got_k, got_v = c.read(0, torch.tensor([9, 0, 5]))
    assert got_k[0, :, :, 0].tolist() == [[9, 0, 5]] * 2 and torch.equal(got_v, -got_k)
    assert c.nbytes == 2 * 3 * 4 * 2 * 4 * 8


def test_the_page_order_is_the_generators_and_seeded_by_default():
    """The pool's order comes from the generator given, else from one seeded with 0: never from torch's
    global RNG, so a run's pages are the same whatever ran before it."""
    def table(**kw):
        return PagedKVCache(1, 2, 1, 16, 4, page_size=2, **kw).block_table  # (2, 8) of 19 pages

    torch.manual_seed(1)
    default = table()
    torch.manual_seed(2)
    assert torch.equal(table(), default)
    assert torch.equal(default.flatten(), torch.randperm(19, generator=torch.Generator().manual_seed(0))[:16].int())
    assert torch.equal(table(generator=torch.Generator().manual_seed(7)).flatten(),
                       torch.randperm(19, generator=torch.Generator().manual_seed(7))[:16].int())


def test_paged_view_slices_are_the_contiguous_cache():
    g = torch.Generator().manual_seed(0)
    full = torch.randn(2, 3, 37, 8, generator=g, dtype=torch.float64)  # (B, Hkv, S, D)
    pages, _, table = paginate(full, full, 16, g)
    view = PagedView(pages, table, 37)
    assert view.shape == (2, 3, 37, 8)
    for index in [(slice(None), slice(None), slice(0, 37)), (slice(None), slice(None), slice(5, 21)),
                  (slice(None), slice(1, 3), slice(30, 37)), (slice(None), slice(None), slice(0, 0)),
                  (slice(1, 2), slice(None), slice(5, 21)), (slice(None), slice(None), slice(None)),  # row 1 alone
                  (slice(None), slice(None), slice(-7, None))]:  # open and negative bounds, as a tensor's
        assert torch.equal(view[index], full[index])
    assert not pages[table[:, 2].long(), 5:].any()  # rows 37 .. 47 of each last page: zero, as paginate says
    ids = table.flatten().tolist()  # every page once, not in order: nothing may lean on contiguous pages
    assert sorted(ids) == list(range(6)) and ids != list(range(6))


def test_paged_view_gathers_a_slice_not_its_length():
    """A slice of a PagedView gathers its own positions: a view 2**62 positions long (whose positions
    ``0 .. length-1`` no tensor could hold) still slices, so the reference's windowed draft over a paged
    cache costs its key set, not the context."""
    g = torch.Generator().manual_seed(1)
    full = torch.randn(1, 2, 32, 8, generator=g, dtype=torch.float64)  # (B, Hkv, S, D)
    pages, _, table = paginate(full, full, 4, g)
    view = PagedView(pages, table, 1 << 62)
    assert torch.equal(view[:, :, 3:9], full[:, :, 3:9]) and torch.equal(view[:, :, 28:32], full[:, :, 28:32])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_attend_equals_the_contiguous_cache(page_size, impl):
    g = torch.Generator().manual_seed(page_size)
    D, dev = 16, "cuda" if CUDA else "cpu"  # the kernel's smallest head dim; the kernel's device
    c = PagedKVCache(1, 1, 2, 40, D, page_size=page_size, dtype=torch.float64, generator=g, device=dev)
    full = KVCache(1, 1, 2, 40, D, dtype=torch.float64, device=dev)
    for a in range(0, 40, 8):  # writes of 8 positions, each followed by queries at them
        pos = torch.arange(a, a + 8, device=dev)
        k, v = torch.randn(2, 1, 2, 8, D, generator=g, dtype=torch.float64).to(dev)
        c.update(0, pos, k, v)
        full.update(0, pos, k, v)
        q = torch.randn(1, 4, 8, D, generator=g, dtype=torch.float64).to(dev)  # (B, Hq, L, D): GQA group 2
        for n_sink, window in [(2, 6), (0, 3), (0, None)]:
            q_sink = q.flip(-1) if window is not None else None  # re-indexed sinks, any queries
            torch.testing.assert_close(c.attend(0, q, pos, n_sink, window, impl, q_sink),
                                       full.attend(0, q, pos, n_sink, window, "torch", q_sink), rtol=0, atol=1e-12)


def test_copy_ring_fill_and_bad_caches():
    c = paged(4)
    c.update(0, torch.arange(10), *torch.ones(2, 1, 2, 10, 4, dtype=torch.float64))
    twin = c.copy()
    twin.update(0, torch.tensor([3]), *torch.zeros(2, 1, 2, 1, 4, dtype=torch.float64))
    # keys and values both the copy's own (a copy sharing the values survived, session 54)
    assert all(x.eq(1).all() for x in c.read(0, torch.tensor([3]))) and all(x.eq(0).all() for x in twin.read(
        0, torch.tensor([3])))
    assert torch.equal(twin.block_table, c.block_table)
    g = torch.Generator().manual_seed(2)
    full, pages = KVCache(1, 1, 2, 30, 4, dtype=torch.float64), paged(16, max_len=30)
    kv = torch.randn(2, 1, 2, 30, 4, generator=g, dtype=torch.float64)
    full.update(0, torch.arange(30), *kv)
    pages.update(0, torch.arange(30), *kv)
    rings = [RingKVCache(1, 1, 2, 4, n_sink=2, window=6, spare=3, max_len=30, dtype=torch.float64) for _ in range(2)]
    rings[0].fill_from(full, 25)
    rings[1].fill_from(pages, 25)
    assert torch.equal(rings[0].k, rings[1].k) and torch.equal(rings[0].v, rings[1].v)
    for kwargs, match in [(dict(page_size=0), "page_size"), (dict(page_size=True), "page_size"),
                          (dict(page_size=11), "page_size must be at most max_len 10, got 11")]:  # a 1e12 one: OOM
        with pytest.raises(ValueError, match=match):
            PagedKVCache(1, 1, 2, 10, 4, **kwargs)
    one = PagedKVCache(1, 1, 2, 10, 4, page_size=10)  # a page as long as max_len: it holds them all
    assert one.block_table.shape == (1, 1) and one.k.shape == (1, 3, 10, 2, 4)  # the page, a spare, a scratch
    with pytest.raises(ValueError, match="do not fit"):
        c.update(0, torch.tensor([10]), *torch.zeros(2, 1, 2, 1, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="ring or page_size"):
        harness_models()[1].new_cache(max_len=10, ring=(2, 6, 3), page_size=4)
    with pytest.raises(ValueError, match="page_size"):
        prefill_prompt(*harness_models()[:1], random_prompt(5), 20, page_size=0)
    with pytest.raises(ValueError, match="page_size must be at most max_len 20, got 1000000000000"):
        prefill_prompt(*harness_models()[:1], random_prompt(5), 20, page_size=10**12)  # the allocator's error before


def test_a_fork_shares_the_pages_below_filled_and_writes_its_own():
    """NOTE [Forks], literal pages: 12 positions in pages of 4, positions 0..5 filled."""
    c = paged(4, max_len=12)  # 3 pages, a spare, a scratch
    kv = torch.arange(12, dtype=torch.float64).view(1, 1, 12, 1).expand(2, 1, 2, 12, 4)  # position p holds p
    c.update(0, torch.arange(6), *kv[:, :, :, :6])
    before = (c.k.clone(), c.block_table.clone())
    f = c.fork(6, 10)  # page 0 shared, page 1 copied (rows 4, 5 kept), page 2 its own
    table, parent = f.block_table[0].tolist(), c.block_table[0].tolist()
    assert table[0] == parent[0] and set(table[1:]) == set(range(5)) - {*parent[:2], c._free.scratch}
    assert (f.nbytes, f.shared_nbytes) == (3 * 2 * 4 * 2 * 4 * 8, 1 * 2 * 4 * 2 * 4 * 8)
    assert f.read(0, torch.arange(6))[0][0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    f.update(0, torch.arange(6, 10), *-kv[:, :, :, 6:10])
    assert f.read(0, torch.arange(10))[0][0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, -6, -7, -8, -9]
    assert torch.equal(c.read(0, torch.arange(6))[0], kv[0, :, :, :6])  # the parent's rows, untouched
    assert torch.equal(c.k[:, [parent[0], parent[1]]], before[0][:, [parent[0], parent[1]]])
    for pos, match in [([5], "writable positions \\[6, 10\\)"), ([10], "do not fit")]:  # its own positions only
        with pytest.raises(ValueError, match=match):
            f.update(0, torch.tensor(pos), *torch.zeros(2, 1, 2, 1, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="read-only"):  # the first fork froze the parent
        c.update(0, torch.tensor([7]), *torch.zeros(2, 1, 2, 1, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="free pages"):  # page 2 of the parent and the spare: f took both
        c.fork(6, 10)
    del f  # collected: its pages are free again
    short = c.fork(6, 7)  # page 1 copied, page 2 past `needed`: the scratch page
    assert short.block_table[0, 2] == c._free.scratch and short.block_table[0, 1] not in parent[:2]
    assert c.k[:, c._free.scratch].eq(0).all() and c.block_table.equal(before[1])
    for args, match in [((5, 10), "frozen at 6"), ((6, 13), "needed <= max_len"), ((7, 6), "filled <= needed"),
                        ((6.0, 10), "int"), ((True, 10), "int")]:
        with pytest.raises(ValueError, match=match):
            c.fork(*args)
    with pytest.raises(ValueError, match="not the fork"):
        short.fork(6, 7)
    full = paged(4, max_len=8)  # every position filled, at a page boundary: a fork writes nothing
    full.update(0, torch.arange(8), *kv[:, :, :, :8])
    none = full.fork(8, 8)
    assert none.block_table.equal(full.block_table) and none.nbytes == none.shared_nbytes == full.nbytes
    twin = short.copy()  # a copy of a fork: a cache of its own, which forks afresh, writing the fork's positions
    assert twin.shared_nbytes == 0 < short.shared_nbytes  # it shares no page
    assert twin.read(0, torch.arange(6))[0].equal(c.read(0, torch.arange(6))[0])
    with pytest.raises(ValueError, match="do not fit"):  # past `needed`: its entries address one scratch page
        twin.update(0, torch.tensor([8]), *torch.zeros(2, 1, 2, 1, 4, dtype=torch.float64))
    assert twin.fork(0, 3).shared_nbytes == 0 and c.nbytes == 2 * 2 * 4 * 2 * 4 * 8  # frozen: pages 0, 1 its own
    assert c.copy().nbytes == 3 * 2 * 4 * 2 * 4 * 8  # a frozen cache's copy: a cache of its own, every page


def test_forks_of_two_sequences_copy_each_ones_page():
    """Batch 2, 8 positions in pages of 4, positions 0..4 filled: each sequence's page 1 copied."""
    c = PagedKVCache(1, 2, 1, 8, 2, page_size=4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    kv = torch.arange(10, dtype=torch.float64).view(2, 1, 5, 1).expand(2, 1, 5, 2)  # sequence b, position p: 5b+p
    c.update(0, torch.arange(5), kv, -kv)
    f = c.fork(5, 8)
    assert f.block_table[:, 0].equal(c.block_table[:, 0]) and not set(f.block_table[:, 1].tolist()) & set(
        c.block_table.flatten().tolist())
    k, v = f.read(0, torch.arange(5))  # (2, 1, 5, 2)
    assert k[:, 0, :, 0].tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] and torch.equal(v, -k)
    assert (f.nbytes, f.shared_nbytes) == (4 * 4 * 2 * 8 * 2, 2 * 4 * 2 * 8 * 2)


def test_a_fork_gives_its_pages_back_and_outlives_its_parent():
    c = paged(4, max_len=12)
    c.update(0, torch.arange(6), *torch.ones(2, 1, 2, 6, 4, dtype=torch.float64))
    f = c.fork(6, 12)  # takes every free page
    f.me = f  # a reference cycle: only the collector frees it
    del f
    g = c.fork(6, 12)  # the pool found short, the collector runs, the cycle's pages come back
    free = c._free
    del c  # the parent goes; the fork keeps the pool's tensors, and still gives its pages back
    import gc
    gc.collect()
    assert g.read(0, torch.arange(6))[0].eq(1).all() and free.ids == []
    del g
    gc.collect()
    assert len(free.ids) == 2


def test_a_fork_from_a_negative_position_is_refused():
    """filled = -1 would freeze nothing and give the fork a table starting at logical page -1 (the last)."""
    c = paged(4, max_len=12)
    with pytest.raises(ValueError, match="0 <= filled <= needed"):
        c.fork(-1, 5)
    assert c._free is None  # not frozen: still writable
    c.update(0, torch.tensor([3]), *torch.ones(2, 1, 2, 1, 4, dtype=torch.float64))


def test_a_fork_one_page_short_is_refused():
    """A fork needing one page more than are free: the pool's ValueError, not fewer pages (a RuntimeError)."""
    c = paged(4, max_len=12)
    f = c.fork(6, 10)  # takes both free pages: the parent's page 2 and the spare
    with pytest.raises(ValueError, match="a fork needs 1 free pages and the pool has 0"):
        c.fork(6, 7)
    assert f.block_table.shape == (1, 3)


@pytest.fixture(scope="module")
def models():
    return harness_models()


@pytest.mark.parametrize("positions", ["absolute", "reindexed"])
def test_the_head_reads_a_paged_cache_as_a_contiguous_one(models, positions):
    """The head's extends of 8 positions at a time: the same logits from a paged draft KV (1e-12)."""
    target, head = models
    prompt = random_prompt(41, seed=9)
    _, hidden = target(prompt[None])  # (1, 41, d)
    for n_sink, window in [(4, 8), (0, None), (1, 2)]:
        runs = []
        for cache in (head.new_cache(max_len=64), head.new_cache(max_len=64, page_size=16)):
            runs.append(torch.cat([head(hidden[:, a:a + 8], prompt[None, a + 1:a + 9], torch.arange(a, a + 8), cache,
                                        n_sink, window, "torch", positions)[0] for a in range(0, 40, 8)], 1))
        torch.testing.assert_close(runs[1], runs[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("n_sink, window", [(0, None), (4, 8), (2, 3)])
def test_decoding_from_a_paged_prefill_is_lossless(models, n_sink, window, page_size):
    """Every decoder from a paged prefill: the dense tokens, and the contiguous run's accepts (oracle
    drafts right for j = 0..3 tokens, so every accept length occurs)."""
    target, head = models
    prompt, depth = random_prompt(30, seed=page_size), 3
    max_len = 30 + 24 + depth + 16  # room past every run's `needed`: its forks address the scratch page there
    pre = prefill_prompt(target, prompt, max_len, draft=head, page_size=page_size)
    assert isinstance(pre.target_cache, PagedKVCache) and isinstance(pre.draft_cache, PagedKVCache)
    prompt_kv = {id(c): [torch.stack(c.read(i, torch.arange(n))) for i in range(c.k.shape[0])]  # every layer's
                 for c, n in ((pre.target_cache, 30), (pre.draft_cache, 29))}
    dense = wmtp.greedy_generate(target, prompt, 24)
    assert torch.equal(wmtp.greedy_generate(target, prompt, 24, prefill=pre), dense)
    seq = torch.cat([prompt, dense, torch.zeros(depth + 2, dtype=torch.long)])
    caches = ["full"] + (["ring"] if window is not None else [])
    for j in range(depth + 1):  # the oracle drafts from the sequence (its cache unread): the target's paging
        draft = grading.OracleDraft(head, seq, j, V)
        oracle_pre = prefill_prompt(target, prompt, 30 + 24 + depth, draft=draft, page_size=page_size)
        for cache in caches:
            out, stats = wmtp.speculative_generate(target, draft, prompt, 24, depth, n_sink, window,
                                                   prefill=oracle_pre, draft_cache=cache)
            ref, ref_stats = wmtp.speculative_generate(target, draft, prompt, 24, depth, n_sink, window,
                                                       draft_cache=cache)
            assert torch.equal(out, dense) and torch.equal(ref, dense), (j, cache)
            same_counts(stats, ref_stats)
    paged_head, contiguous = LogitsRecorder(head), LogitsRecorder(head)
    paged_pre = prefill_prompt(target, prompt, max_len, draft=paged_head, page_size=page_size)
    out, stats = wmtp.speculative_generate(target, paged_head, prompt, 24, depth, n_sink, window, prefill=paged_pre)
    ref, ref_stats = wmtp.speculative_generate(target, contiguous, prompt, 24, depth, n_sink, window)
    assert torch.equal(out, dense) and torch.equal(ref, dense)
    same_counts(stats, ref_stats)
    same_drafts(contiguous, paged_head)  # the head's own paged draft KV: the contiguous run's logits, call by call
    static, _ = wmtp.static_speculative_generate(target, head, prompt, 24, depth, n_sink, window, prefill=pre)
    assert torch.equal(static, dense)
    sampled, _ = wmtp.speculative_sample(target, head, prompt, 24, depth, n_sink, window, temperature=0.9, seed=4,
                                         method="gumbel", prefill=pre)
    assert torch.equal(sampled, wmtp.sample_generate(target, prompt, 24, temperature=0.9, seed=4))
    for cache, filled in ((pre.target_cache, 30), (pre.draft_cache, 29)):  # NOTE [Forks]: runs wrote their own pages
        assert all(torch.equal(torch.stack(cache.read(i, torch.arange(filled))), prompt_kv[id(cache)][i])
                   for i in range(cache.k.shape[0]))
        scratch = cache._free.scratch  # no run wrote past its `needed` positions
        assert cache.k[:, scratch].eq(0).all() and cache.v[:, scratch].eq(0).all()
        pages = -(-max_len // page_size)  # every fork gave its pages back: those past `filled`, a spare
        assert len(cache._free.ids) == pages - -(-filled // page_size) + 1


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_cuda_paged_decoding_is_lossless(models, impl, page_size):
    target, head = (m.to("cuda") for m in copy.deepcopy(models))
    prompt = random_prompt(40, seed=3).cuda()
    dense = wmtp.greedy_generate(target, prompt, 24, impl=impl)
    pre = prefill_prompt(target, prompt, 40 + 24 + 3 + 32, draft=head, impl=impl, page_size=page_size)
    for cache in ("full", "ring"):
        out, _ = wmtp.speculative_generate(target, head, prompt, 24, 3, 4, 8, impl=impl, prefill=pre, draft_cache=cache)
        assert torch.equal(out, dense), cache
    static, _ = wmtp.static_speculative_generate(target, head, prompt, 24, 3, 4, 8, impl=impl, prefill=pre)
    assert torch.equal(static, dense)
    for c in (pre.target_cache, pre.draft_cache):  # NOTE [Forks]: captured steps wrote nothing past `needed`
        assert c.k[:, c._free.scratch].eq(0).all() and c.v[:, c._free.scratch].eq(0).all()


def test_a_pool_of_more_pages_than_an_int32_block_table_addresses_is_refused():
    """2**16 sequences of 2**15 one-key pages, plus a spare each and one more: 2**31 + 2**16 + 1 pages,
    whose ids past 2**31 - 1 would wrap to negative (another sequence's pages) in the int32 block
    table: refused before anything is allocated."""
    from wmtp.pagedcache import PagedKVCache

    with pytest.raises(ValueError, match=r"^a pool of 2147549185 pages exceeds the int32 block table$"):
        PagedKVCache(1, 2**16, 1, 2**15, 1, page_size=1)
