"""A shared prefill (wmtp/prefill.py): runs from one ``prefill_prompt`` give dense greedy's tokens and
the counts of runs that prefill themselves, in every loop, arm and depth, and never change it.

Float64 on CPU (decode.py NOTE [Exactness]); bench decode runs the same on the H200.
"""

import copy

import pytest
import torch
from decode_harness import HeadProxy, V, random_prompt, same_counts
from op_impls import DEVICE, IMPLS

import wmtp
from wmtp.grading import harness_models

KEYSETS = [(0, None), (4, 16), (0, 1), (2, 3)]
LOOPS = {"eager": (wmtp.greedy_generate, wmtp.speculative_generate),
         "static": (wmtp.static_greedy_generate, wmtp.static_speculative_generate)}


@pytest.fixture(scope="module")
def models():
    return harness_models()


class Forced(HeadProxy):
    """The real head (its attention and caches) with a logit bonus making the first ``j`` drafts of
    a step right, the rest wrong; records each step call's logits and ``g`` by (call, position)."""

    def __init__(self, head, sequence: torch.Tensor, depth: int):
        self.head, self.seq, self.depth, self.j = head, sequence, depth, 0
        self.reset()

    def reset(self) -> None:
        self.calls, self.rows = 0, {}

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        logits, g = self.head(hidden, next_ids, pos, cache, n_sink, window, impl)
        call, self.calls = self.calls, self.calls + 1
        i = call % self.depth
        for r, p in enumerate(pos.tolist()):
            self.rows[call, p] = logits[0, r].clone(), g[0, r].clone()
        truth = self.seq[(pos + 2).clamp(max=self.seq.numel() - 1)]  # (L,)
        bonus = torch.zeros_like(logits)
        bonus[0, torch.arange(pos.numel()), truth if i < self.j else (truth + 1) % V] = 1e6
        return logits + bonus, g


@pytest.mark.parametrize("P", [2, 40])
def test_the_draft_prefill_cache_is_the_same_for_every_key_set(models, P):
    """NOTE [Shared draft prefill]: the one-block head writes the same keys and values whatever its
    key set, and ``write_cache`` (the prefill's: no attention, MLP or logits) writes those bits, so
    it serves every arm. The caches are built here by calling the models directly, not through
    wmtp/prefill.py."""
    target, head = models
    prompt = random_prompt(P)
    pre = wmtp.prefill_prompt(target, prompt, 64, draft=head)
    tcache = target.new_cache(1, 64)
    logits, hidden = target(prompt[None], torch.arange(P), tcache, logits_at=torch.tensor([[P - 1]]))  # [Logits at]
    assert torch.equal(pre.target_cache.k, tcache.k) and torch.equal(pre.target_cache.v, tcache.v)
    assert torch.equal(pre.logits, logits[0, 0]) and torch.equal(pre.hidden, hidden[:, -1:])
    d = hidden.shape[-1]  # the prefill keeps the last position's (1, 1, d) alone, not a view pinning all P
    assert pre.hidden.untyped_storage().nbytes() == d * pre.hidden.element_size()
    for n_sink, window in KEYSETS:
        dcache = head.new_cache(1, 64)
        head(hidden[:, :-1], prompt[None, 1:], torch.arange(P - 1), dcache, n_sink, window)
        assert torch.equal(pre.draft_cache.k, dcache.k) and torch.equal(pre.draft_cache.v, dcache.v), (n_sink, window)
    written = pre.draft_cache.k[:, :, :, : P - 1]  # (1, 1, Hkv, P-1, D)
    assert (written.abs().sum(-1) > 0).all() and not pre.draft_cache.k[:, :, :, P - 1:].any()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("layout", [{}, {"page_size": 4}, {"ring": (2, 5, 3)}])
@torch.no_grad()
def test_write_cache_writes_the_bits_forward_writes(models, layout, per_row, impl):
    """``MTPHead.write_cache`` (the prefill's) against ``forward`` under every key set the cache takes:
    the same keys and values bit for bit, in a contiguous, a paged and a ring cache, at positions
    ``(L,)`` or ``(B, L)`` (each row's own), calls of 4 positions (a ring serves spare + 1 queries a call)."""
    target, head = (m.to(DEVICE) for m in copy.deepcopy(models))  # one copy of both: the head shares the embedding
    B, d = 2, target.config.d_model
    g = torch.Generator().manual_seed(7)
    for norm in (head.block.attn_norm, head.block.mlp_norm):  # unlike (both start at ones), so a write that
        norm.weight.copy_(torch.rand(d, generator=g, dtype=torch.float64) + 0.5)  # norms with the MLP's shows
    hidden = torch.randn(B, 12, d, generator=g, dtype=torch.float64).to(DEVICE)  # (B, 12, d)
    ids = torch.randint(0, V, (B, 12), generator=g).to(DEVICE)  # (B, 12)
    keysets = [(2, 5), (0, 1)] + ([] if "ring" in layout else [(None, None), (1, 3)])
    for n_sink, window in keysets:
        by_forward, by_write = (head.new_cache(B, 32, **layout) for _ in range(2))
        for a in range(0, 12, 4):
            pos = torch.arange(a, a + 4, device=DEVICE)  # (4,)
            if per_row:
                pos = torch.stack([pos, pos + 9])  # (B, 4): row 1 nine positions on
            head(hidden[:, a:a + 4], ids[:, a:a + 4], pos, by_forward, n_sink, window, impl)
            head.write_cache(hidden[:, a:a + 4], ids[:, a:a + 4], pos, by_write, impl)
        assert by_write.k.abs().sum() > 0
        assert torch.equal(by_write.k, by_forward.k) and torch.equal(by_write.v, by_forward.v), (n_sink, window)


@pytest.mark.parametrize("depth", [1, 3, 8])
def test_one_prefill_serves_every_arm_and_loop(models, depth):
    target, head = models
    prompt = random_prompt(30, seed=depth)
    ref = wmtp.greedy_generate(target, prompt, 25)
    pre = wmtp.prefill_prompt(target, prompt, 30 + 25 + depth, draft=head)
    before = [(c.k.clone(), c.v.clone()) for c in (pre.target_cache, pre.draft_cache)]
    for loop, (greedy, speculative) in LOOPS.items():
        assert torch.equal(greedy(target, prompt, 25, prefill=pre), ref), loop
        for n_sink, window in KEYSETS:
            out, stats = speculative(target, head, prompt, 25, depth, n_sink, window, prefill=pre)
            own_out, own = speculative(target, head, prompt, 25, depth, n_sink, window)
            assert torch.equal(out, ref) and torch.equal(own_out, ref), (loop, n_sink, window)
            same_counts(stats, own)
    for (k, v), new in zip(before, (pre.target_cache, pre.draft_cache)):  # no run wrote into the prefill
        assert torch.equal(k, new.k) and torch.equal(v, new.v)


@pytest.mark.parametrize("prompt_len", [2, 21])
@pytest.mark.parametrize("n_sink,window,draft_cache", [(*keys, "full") for keys in KEYSETS] + [(2, 3, "ring")])
def test_every_accept_length_drafts_the_same_rows(models, n_sink, window, draft_cache, prompt_len):
    """The real head forced to every accept length j: from the shared prefill, each draft call's
    logits and hidden state equal those of a run that prefilled itself (float64, 1e-9), both loops.
    (The random head alone accepts nothing: only these rows see the draft cache the prefill left.)
    A ring (wmtp/ringcache.py) is filled from the prefill's chain, positions 0 .. P-2: the first
    extend, at P-1, reads P-3 .. P-1 (window 3), so a ring filled short of P-2 drafts other rows."""
    target, head = models
    prompt, depth = random_prompt(prompt_len, seed=3), 4
    ref = wmtp.greedy_generate(target, prompt, 30)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    shared = Forced(head, seq, depth)
    pre = wmtp.prefill_prompt(target, prompt, prompt_len + 30 + depth, draft=shared)
    for loop, (_, speculative) in LOOPS.items():
        for j in range(depth + 1):
            own = Forced(head, seq, depth)
            shared.j = own.j = j
            shared.reset()
            out, stats = speculative(target, shared, prompt, 30, depth, n_sink, window, prefill=pre,
                                     draft_cache=draft_cache)
            own_out, own_stats = speculative(target, own, prompt, 30, depth, n_sink, window, draft_cache=draft_cache)
            assert torch.equal(out, ref) and torch.equal(own_out, ref), (loop, j)
            same_counts(stats, own_stats)
            assert stats.accept_length_histogram[j] >= stats.steps - 1, (loop, j)
            assert own.rows.keys() == shared.rows.keys() and own.rows, (loop, j)
            for key, (logits, g) in own.rows.items():
                torch.testing.assert_close(shared.rows[key][0], logits, rtol=0, atol=1e-9)
                torch.testing.assert_close(shared.rows[key][1], g, rtol=0, atol=1e-9)


@pytest.mark.parametrize("prompt_len", [1, 2, 17])
def test_a_run_may_fill_the_prefill_exactly(models, prompt_len):
    target, head = models
    prompt, depth, n = random_prompt(prompt_len, seed=prompt_len), 3, 9
    ref = wmtp.greedy_generate(target, prompt, n)
    spec_needed = prompt_len + n + depth - 1  # the verify pass of the last step writes up to P + n + depth - 2
    pre = wmtp.prefill_prompt(target, prompt, spec_needed, draft=head)
    for loop, (greedy, speculative) in LOOPS.items():
        assert torch.equal(greedy(target, prompt, n, prefill=pre), ref), loop
        assert torch.equal(speculative(target, head, prompt, n, depth, 4, 16, prefill=pre)[0], ref), loop
    short = wmtp.prefill_prompt(target, prompt, spec_needed - 1, draft=head)
    for loop, (_, speculative) in LOOPS.items():
        with pytest.raises(ValueError, match="prefill's caches hold"):
            speculative(target, head, prompt, n, depth, 4, 16, prefill=short)


def test_a_cache_copy_owns_its_storage(models):
    target, _ = models
    cache = target.new_cache(1, 8)
    cache.k.normal_(), cache.v.normal_()
    copy_ = cache.copy()
    assert copy_.checked and not cache.copy(checked=False).checked
    assert torch.equal(copy_.k, cache.k) and torch.equal(copy_.v, cache.v)
    copy_.k.zero_(), copy_.v.zero_()
    assert cache.k.abs().sum() > 0 and cache.v.abs().sum() > 0


def test_runs_start_from_copies_checked_as_asked(models):
    from wmtp.prefill import start

    target, head = models
    prompt = random_prompt(6)
    pre = wmtp.prefill_prompt(target, prompt, 20, draft=head)
    for checked in (True, False):
        got = start(target, head, prompt, needed=20, impl="torch", checked=checked, prefill=pre)
        for cache in (got.target_cache, got.draft_cache):
            assert cache.checked is checked
        assert got.target_cache.k.data_ptr() != pre.target_cache.k.data_ptr()
        assert got.draft_cache.v.data_ptr() != pre.draft_cache.v.data_ptr()


def test_a_prompt_of_any_integer_dtype_and_the_prefills_own_copy(models):
    """An int32 prompt prefills and decodes as its int64 twin; the prefill keeps its own copy of the
    prompt, so editing the caller's tensor afterwards makes it another prompt, refused."""
    target, head = models
    prompt = random_prompt(12)
    ref = wmtp.greedy_generate(target, prompt, 10)
    small = prompt.int()
    pre = wmtp.prefill_prompt(target, small, 40, draft=head)
    for greedy, speculative in LOOPS.values():
        assert torch.equal(greedy(target, small, 10, prefill=pre), ref)
        assert torch.equal(speculative(target, head, small, 10, 3, 4, 16, prefill=pre)[0], ref)
    edited = prompt.clone()
    pre = wmtp.prefill_prompt(target, edited, 40)
    edited[5] = (edited[5] + 1) % V
    with pytest.raises(ValueError, match="another prompt"):
        wmtp.greedy_generate(target, edited, 10, prefill=pre)


def test_bad_prefills_raise_value_error(models):
    target, head = models
    prompt = random_prompt(10)
    pre = wmtp.prefill_prompt(target, prompt, 40, draft=head)
    alone = wmtp.prefill_prompt(target, prompt, 40)
    other_target = copy.deepcopy(target)
    other_head = wmtp.MTPHead(head.config, target).double()
    twin_head = wmtp.MTPHead(head.config, other_target).double()  # a head of the other target, as it should be
    cases = [
        (lambda g, s: g(target, random_prompt(10, seed=1), 5, prefill=pre), "another prompt"),
        (lambda g, s: g(target, prompt[:9], 5, prefill=pre), "another prompt"),
        (lambda g, s: g(other_target, prompt, 5, prefill=pre), "other models"),
        (lambda g, s: s(target, other_head, prompt, 5, 2, prefill=pre), "other models"),
        (lambda g, s: s(target, head, prompt, 5, 2, prefill=alone), "made without a draft head"),
        (lambda g, s: s(other_target, twin_head, prompt, 5, 2, prefill=alone), "other models"),  # not 'without'
        (lambda g, s: g(target, prompt, 5, prefill="cache"), "wmtp.Prefill"),
        (lambda g, s: g(target, [prompt, prompt], 5, prefill=pre), "batch of prompts"),
        (lambda g, s: s(target, head, [prompt], 5, 2, prefill=pre), "batch of prompts"),
    ]
    for loop, (greedy, speculative) in LOOPS.items():
        for call, match in cases:
            with pytest.raises(ValueError, match=match):
                call(greedy, speculative)
    moved = copy.deepcopy(target)
    moved_pre = wmtp.prefill_prompt(moved, prompt, 40)
    moved.float()
    with pytest.raises(ValueError, match="prefill_prompt again"):
        wmtp.greedy_generate(moved, prompt, 5, prefill=moved_pre)
    for max_len, match in [(9, "max_len"), (target.config.max_seq_len + 1, "max_len"), (True, "max_len"),
                           (10.0, "max_len")]:
        with pytest.raises(ValueError, match=match):
            wmtp.prefill_prompt(target, prompt, max_len)
    with pytest.raises(ValueError, match="1-D"):
        wmtp.prefill_prompt(target, prompt[None], 40)
    import dataclasses

    wide = wmtp.TargetLM(dataclasses.replace(target.config, d_model=2 * target.config.d_model)).double()
    with pytest.raises(ValueError, match="another config"):
        wmtp.prefill_prompt(target, prompt, 40, draft=wmtp.MTPHead(head.config, wide).double())
    for bad in (V, -1):  # one past the vocabulary; a negative id would embed the last token's row
        with pytest.raises(ValueError, match="prompt token ids"):
            wmtp.prefill_prompt(target, torch.tensor([3, bad]), 40)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl,graph", [("torch", False), ("triton", False), ("triton", True)])
@pytest.mark.parametrize("depth", [1, 3])
def test_one_prefill_serves_every_arm_and_loop_on_cuda(impl, graph, depth):
    """Float64 on the GPU, with each impl and through the CUDA graphs: runs from one prefill give the
    same impl's self-prefilled dense tokens and the self-prefilled runs' counts."""
    target, head = (m.cuda() for m in copy.deepcopy(harness_models()))
    prompt = random_prompt(30, seed=depth).cuda()
    ref = wmtp.greedy_generate(target, prompt, 25, impl=impl)
    pre = wmtp.prefill_prompt(target, prompt, 30 + 25 + depth, draft=head, impl=impl)
    assert torch.equal(wmtp.greedy_generate(target, prompt, 25, impl=impl, prefill=pre), ref)
    if impl == "torch":  # the same prompt on the CPU: its device is checked before the prefill is
        with pytest.raises(ValueError, match="prompt_ids is on cpu, the target on cuda"):
            wmtp.greedy_generate(target, prompt.cpu(), 25, impl=impl, prefill=pre)
        with pytest.raises(ValueError, match="another prompt"):  # a prompt on the GPU that differs in one token
            wmtp.greedy_generate(target, torch.cat([prompt[:-1], (prompt[-1:] + 1) % V]), 25, impl=impl, prefill=pre)
    assert torch.equal(wmtp.static_greedy_generate(target, prompt, 25, impl=impl, cuda_graph=graph, prefill=pre), ref)
    for n_sink, window in KEYSETS:
        for run in (lambda **k: wmtp.speculative_generate(target, head, prompt, 25, depth, n_sink, window, impl=impl,
                                                          **k),
                    lambda **k: wmtp.static_speculative_generate(target, head, prompt, 25, depth, n_sink, window,
                                                                 impl=impl, cuda_graph=graph, **k)):
            (out, stats), (own_out, own) = run(prefill=pre), run()
            assert torch.equal(out, ref) and torch.equal(own_out, ref), (n_sink, window)
            same_counts(stats, own)


def test_max_len_may_be_the_prompts_length_but_not_a_bool(models):
    """``max_len`` equal to the prompt's length is a prefill (one new token needs no more), and
    ``True`` is refused even where ``1`` is taken (mutation round 7, part d: ``max_len`` required
    past the prompt, and the bool check dropped, survived the tests above)."""
    target, head = models
    for P in (1, 10):
        prompt = random_prompt(P, seed=P)
        pre = wmtp.prefill_prompt(target, prompt, P, draft=head)
        assert pre.max_len == P and pre.draft_cache.max_len == P
        ref = wmtp.greedy_generate(target, prompt, 1)
        assert torch.equal(wmtp.greedy_generate(target, prompt, 1, prefill=pre), ref)
    with pytest.raises(ValueError, match="max_len must be an int from the prompt's 1 tokens"):
        wmtp.prefill_prompt(target, random_prompt(1), True)
