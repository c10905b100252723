"""Lockstep batched speculative decoding (wmtp/lockstep.py): every row equals its dense greedy
decoding token for token (float64, NOTE [Batch exactness]), for every depth, key set and impl; the
batch commits the least of its rows' matches each step, and its counters say so."""

import copy

import pytest
import torch
from decode_harness import Cycling, HeadProxy, StepClock, V
from decode_harness import random_prompts as prompts

import wmtp
from wmtp.grading_checks import harness_models
from wmtp.lockstep import batched_greedy_generate, lockstep_generate

KEYSETS = [(None, None), (4, 16), (0, 8), (2, 1)]


@pytest.fixture(scope="module")
def models():
    return harness_models()


class Oracle(HeadProxy):
    """The real head with its logits replaced: row ``b``'s drafts of the step that verifies from
    position ``n`` are right for the first ``j(b, n)``, then wrong (default ``(7 n + b) % (K + 1)``,
    so rows and steps differ). Draft ``i`` sits at position ``n - 1 + i`` and guesses the token at
    ``n + 1 + i`` of its row's ``sequence`` (prompt and greedy continuation). The hidden states and
    the cache writes are the head's own; a call is recursive (``i`` one more than the last call's)
    when its hidden input is a view of the last call's output, as the loops pass ``g[:, -1:]``."""

    def __init__(self, head, sequences: torch.Tensor, depth: int, j=None):
        self.head, self.seq, self.K = head, sequences, depth
        self.j = j or (lambda b, n: (7 * n + b) % (depth + 1))
        self.calls, self.index, self.last_g, self.cache = 0, 0, None, None

    def new_cache(self, *args, **kwargs):
        self.cache = self.head.new_cache(*args, **kwargs)
        return self.cache

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        self.calls += 1
        last = self.last_g
        recursive = last is not None and hidden.untyped_storage().data_ptr() == last.untyped_storage().data_ptr()
        self.index = self.index + 1 if recursive else 0
        logits, self.last_g = self.head(hidden, next_ids, pos, cache, n_sink, window, impl)
        t = int(pos[-1])  # the last row's position: it drafts index self.index of the step at n
        n = t + 1 - self.index
        truth = self.seq[:, min(t + 2, self.seq.shape[1] - 1)]  # (B,)
        right = torch.tensor([self.index < self.j(b, n) for b in range(hidden.shape[0])])
        tok = torch.where(right, truth, (truth + 1) % V)  # (B,)
        out = torch.zeros_like(logits)  # (B, L, V)
        out[:, -1].scatter_(1, tok[:, None], 1.0)
        return out, self.last_g


def oracle_for(target, head, ps, depth, new, j=None):
    """An ``Oracle`` over each prompt's greedy continuation, and those continuations."""
    want = [wmtp.greedy_generate(target, p, new + depth + 2) for p in ps]
    return Oracle(head, torch.cat([ps, torch.stack(want)], dim=1), depth, j), want


@pytest.mark.parametrize("depth", [1, 3, 6])
@pytest.mark.parametrize("n_sink, window", KEYSETS)
@pytest.mark.parametrize("B", [1, 3])
def test_every_row_is_its_dense_greedy_decoding(models, B, n_sink, window, depth):
    target, head = models
    ps = prompts(B, 12, seed=B + depth)
    want = [wmtp.greedy_generate(target, p, 25) for p in ps]
    assert all(torch.equal(a, b) for a, b in zip(batched_greedy_generate(target, ps, 25), want))
    out, stats = lockstep_generate(target, head, ps, 25, depth, n_sink, window)
    assert all(torch.equal(a, b) for a, b in zip(out, want))
    assert stats.committed == 24 and stats.batch == B


@pytest.mark.parametrize("depth", [2, 5])
def test_the_batch_commits_its_least_match_each_step(models, depth):
    """With the oracle's known matches: every row equals its greedy decoding, each step keeps
    ``m = min_b j(b, n)`` drafts, and the counters hold the sums the oracle implies."""
    target, head = models
    B, P, new = 3, 9, 40
    ps = prompts(B, P, seed=5)
    oracle, want = oracle_for(target, head, ps, depth, new)
    out, stats = lockstep_generate(target, oracle, ps, new, depth)
    assert all(torch.equal(a, b[:new]) for a, b in zip(out, want))
    n, kept, alone, steps, accepted = P, 0, [0] * B, 0, 0
    while kept < new - 1:  # the steps the oracle implies: each keeps m + 1 tokens a row
        js = [oracle.j(b, n) for b in range(B)]
        m = min(js)
        alone, accepted = [s + j for s, j in zip(alone, js)], accepted + m
        kept, n, steps = kept + m + 1, n + m + 1, steps + 1
    assert (stats.steps, stats.accepted, stats.accepted_alone) == (steps, accepted, alone)
    assert stats.committed == new - 1 and stats.mean_accept_length == (new - 1) / steps
    assert stats.lockstep_efficiency == pytest.approx((accepted + steps) / (sum(alone) / B + steps), rel=1e-12)
    assert stats.lockstep_efficiency < 1  # the rows' matches differ
    assert oracle.calls == steps * depth  # an extend and depth - 1 drafts a step (the prompt's chain: write_cache)


def test_a_depth_policy_drafts_each_steps_depth_and_learns_the_batchs_match(models):
    """A scripted policy: each step drafts its depth, and the policy is told the step's m (the
    batch's least match, as the oracle implies), never a row's own."""
    target, head = models
    B, P, new = 3, 9, 40
    ps = prompts(B, P, seed=7)
    oracle, want = oracle_for(target, head, ps, 4, new)
    policy = Cycling([1, 4, 2])
    out, stats = lockstep_generate(target, oracle, ps, new, policy)
    assert all(torch.equal(a, b[:new]) for a, b in zip(out, want))
    n, expected = P, []
    for k, m in policy.seen:
        expected.append((k, min(min(oracle.j(b, n) for b in range(B)), k)))
        n += m + 1
    assert policy.seen == expected and policy.positions[:3] == [P, P + expected[0][1] + 1,
                                                                 P + expected[0][1] + expected[1][1] + 2]
    assert stats.steps_by_depth == [0, *(sum(k == d for k, _ in policy.seen) for d in range(1, 5))]
    adaptive, _ = lockstep_generate(target, head, ps, new, wmtp.AdaptiveDepth(6), 4, 16)
    assert all(torch.equal(a, b[:new]) for a, b in zip(adaptive, want))


@pytest.mark.parametrize("n_sink, window", [(None, None), (4, 16)])
def test_the_caches_hold_each_rows_true_chain(models, monkeypatch, n_sink, window):
    """After a run whose rows matched differently: the target's cache holds every row's committed
    chain and the head's the true chain it consumed, each as one pass over the row's tokens would
    write it (so the extend's hidden states and tokens are each row's own)."""
    target, head = models
    B, P, new, depth = 3, 7, 30, 4
    ps = prompts(B, P, seed=8)
    oracle, want = oracle_for(target, head, ps, depth, new)
    caches = []
    plain = type(target).new_cache
    monkeypatch.setattr(target, "new_cache", lambda *a, **kw: caches.append(plain(target, *a, **kw)) or caches[-1])
    policy = Cycling([depth])
    lockstep_generate(target, oracle, ps, new, policy, n_sink, window)
    monkeypatch.undo()
    assert any(a > 0 for _, a in policy.seen)  # the rows matched some drafts
    n = policy.positions[-1]  # the last step's n: positions < n are every row's true chain
    seq = oracle.seq[:, : n + 1]  # (B, n + 1)
    fresh_t = target.new_cache(B, n + 1)
    _, hidden = target(seq, torch.arange(n + 1), fresh_t, "torch")
    fresh_d = head.new_cache(B, n + 1)
    head(hidden[:, :n - 1], seq[:, 1:n], torch.arange(n - 1), fresh_d, n_sink, window, "torch")
    for got, ref, upto in ((caches[0], fresh_t, n + 1), (oracle.cache, fresh_d, n - 1)):
        for layer in range(len(ref.k)):
            for a, b in ((got.k[layer], ref.k[layer]), (got.v[layer], ref.v[layer])):
                assert torch.allclose(a[:, :, :upto], b[:, :, :upto], rtol=0, atol=1e-10)


def test_one_row_counts_as_speculative_generate(models):
    """A batch of one with drafts that match: the same steps, matches, tokens and draft keys."""
    target, head = models
    ps = prompts(1, 10, seed=12)
    for n_sink, window in [(None, None), (2, 8)]:
        oracle, _ = oracle_for(target, head, ps, 5, 30)
        _, alone = wmtp.speculative_generate(target, oracle, ps[0], 30, 5, n_sink, window)
        oracle, _ = oracle_for(target, head, ps, 5, 30)
        _, lock = lockstep_generate(target, oracle, ps, 30, 5, n_sink, window)
        assert alone.accepted > 0 and (lock.steps, lock.accepted, lock.committed, lock.draft_keys_read) == (
            alone.steps, alone.accepted, alone.committed, alone.draft_keys_read)
    # two copies of one prompt under a depth policy: draft_keys_read is one row's, each step's own depth
    # (a count of every row, or of the policy's largest depth, survived: session 54)
    j = lambda b, n: n % 4  # noqa: E731  the same for both rows
    twice = ps.expand(2, -1)
    for n_sink, window in [(None, None), (2, 8)]:
        policies = Cycling([3, 1, 5]), Cycling([3, 1, 5])
        _, alone = wmtp.speculative_generate(target, oracle_for(target, head, ps, 5, 30, j)[0], ps[0], 30,
                                             policies[0], n_sink, window)
        _, lock = lockstep_generate(target, oracle_for(target, head, twice, 5, 30, j)[0], twice, 30, policies[1],
                                    n_sink, window)
        assert policies[0].seen == policies[1].seen and len({k for k, _ in policies[1].seen}) == 3
        assert alone.accepted > 0 and lock.draft_keys_read == alone.draft_keys_read


def test_the_policy_hears_each_steps_phases(models, monkeypatch):
    """On a fake clock (``StepClock``: consecutive readings 1, 2, 3, ... apart) the counters keep each
    step's draft and verify phases, and the depth policy hears them in that order (session 54: the two
    swapped, in the counters and the policy's update, survived every test of the eager loop)."""
    from wmtp import lockstep

    target, head = models
    clock = StepClock()
    monkeypatch.setattr(lockstep, "time", clock)
    policy = Cycling([2])
    _, stats = lockstep_generate(target, head, prompts(2, 5, seed=3), 6, policy)
    first = clock.calls - 3 * stats.steps  # readings before the first step's (the prefill's)
    draft = [first + 3 * s + 1 for s in range(stats.steps)]  # a step reads t0, t1, t2: spans c + 1, c + 2
    assert stats.steps >= 3 and stats.draft_times_s == draft and stats.verify_times_s == [d + 1 for d in draft]
    assert policy.times == list(zip(draft, [d + 1 for d in draft]))


@pytest.mark.parametrize("row0", ["none", "all"])
def test_a_stopped_row_no_longer_limits_the_batch(models, row0):
    """Row 0 stops at its first token and would match nothing (or every draft: counted nowhere, as
    it no longer lives; mutation round 6: counting a stopped row's own matches survived); row 1 then
    sets every step's m."""
    target, head = models
    ps, new, depth = prompts(2, 8, seed=13), 30 if row0 == "none" else 12, 4
    first = [int(wmtp.greedy_generate(target, p, 1)[0]) for p in ps]
    rest = wmtp.greedy_generate(target, ps[1], new)
    eos = first[0]
    assert eos not in rest.tolist()  # row 1 runs to max_new_tokens
    j0 = depth if row0 == "all" else 0
    oracle, want = oracle_for(target, head, ps, depth, new, j=lambda b, n: j0 if b == 0 else (3 * n) % (depth + 1))
    out, stats = lockstep_generate(target, oracle, ps, new, depth, eos_id=eos)
    assert [o.tolist() for o in out] == [[eos], rest.tolist()]
    n, steps, accepted = 8, 0, 0
    while steps == 0 or n - 8 + 1 < new:
        m = min((3 * n) % (depth + 1), depth)
        n, steps, accepted = n + m + 1, steps + 1, accepted + m
    assert (stats.steps, stats.accepted) == (steps, accepted) and accepted > 0
    assert stats.live_steps == [0, steps] and stats.accepted_alone == [0, accepted]
    assert stats.lockstep_efficiency == 1.0  # the one live row kept all it matched


def test_rows_that_match_alike_lose_nothing(models):
    target, head = models
    ps = prompts(1, 10, seed=3).repeat(4, 1)  # four copies of one prompt
    out, stats = lockstep_generate(target, head, ps, 20, 3, 4, 16)
    solo, solo_stats = wmtp.speculative_generate(target, head, ps[0], 20, 3, 4, 16)
    assert all(torch.equal(o, solo) for o in out)
    assert stats.lockstep_efficiency == 1.0 and stats.accepted == solo_stats.accepted
    assert stats.steps == solo_stats.steps


class Recorder(HeadProxy):
    """The head, recording each call's positions, logits and hidden output."""

    def __init__(self, head):
        self.head, self.calls = head, []

    def __call__(self, *args):
        logits, g = self.head(*args)
        self.calls.append((args[2].tolist(), logits, g))
        return logits, g


@pytest.mark.parametrize("n_sink, window", [(None, None), (4, 16)])
def test_one_row_makes_the_head_calls_of_speculative_generate(models, n_sink, window):
    """A batch of one calls the head at the positions, with the inputs, of the one-sequence loop:
    the same logits and hidden states, call for call (the head's inputs are wired as decode.py's)."""
    target, head = models
    p = prompts(1, 11, seed=9)
    alone, lock = Recorder(head), Recorder(head)
    wmtp.speculative_generate(target, alone, p[0], 18, 3, n_sink, window)
    lockstep_generate(target, lock, p, 18, 3, n_sink, window)
    assert [c[0] for c in alone.calls] == [c[0] for c in lock.calls]
    assert all(torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) for a, b in zip(alone.calls, lock.calls))


def test_a_row_stops_inside_a_step_that_commits_several_tokens(models):
    target, head = models
    ps, new, depth = prompts(3, 6, seed=14), 30, 5
    oracle, want = oracle_for(target, head, ps, depth, new, j=lambda b, n: depth)  # every draft right
    eos = int(want[1][7])  # row 1's eighth token, committed within a step of six tokens
    out, stats = lockstep_generate(target, oracle, ps, new, depth, eos_id=eos)
    assert [o.tolist() for o in out] == [wmtp.greedy_generate(target, p, new, eos_id=eos).tolist() for p in ps]
    assert len(out[1]) <= 8 and stats.accepted > 0


def test_each_row_stops_at_its_own_eos(models):
    target, _ = models
    ps = prompts(3, 8, seed=11)
    free = [wmtp.greedy_generate(target, p, 30) for p in ps]
    eos = int(free[1][4])  # row 1 stops after its fifth token; the others where (if) they meet it
    want = [wmtp.greedy_generate(target, p, 30, eos_id=eos) for p in ps]
    _, head = models
    for out in (batched_greedy_generate(target, ps, 30, eos_id=eos), lockstep_generate(target, head, ps, 30, 3,
                                                                                         eos_id=eos)[0]):
        assert [o.tolist() for o in out] == [w.tolist() for w in want] and len(out[1]) == 5


def test_short_requests(models):
    target, head = models
    ps = prompts(2, 1, seed=2)  # one-token prompts: no true chain for the head
    for new in (0, 1, 2, 7):
        want = [wmtp.greedy_generate(target, p, new) for p in ps]
        out, stats = lockstep_generate(target, head, ps, new, 4)
        assert [o.tolist() for o in out] == [w.tolist() for w in want]
        assert stats.committed == max(new - 1, 0)
        assert new > 1 or (stats.steps == 0 and stats.lockstep_efficiency == 1.0)  # no step ran


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the Triton kernels on the GPU")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_every_row_is_its_dense_greedy_decoding_on_cuda(models, impl):
    # copies: harness_models() is cached, and Module.cuda() moves it in place for every later test in this process
    target, head = (m.cuda() for m in copy.deepcopy(harness_models()))
    ps = prompts(3, 30, seed=4).cuda()
    want = [wmtp.greedy_generate(target, p, 20, impl=impl) for p in ps]
    out, _ = lockstep_generate(target, head, ps, 20, 4, 4, 16, impl=impl)
    assert all(torch.equal(a, b) for a, b in zip(out, want))


def test_triton_under_the_interpreter(models):
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("the Triton kernels under the CPU interpreter")
    target, head = models
    ps = prompts(2, 10, seed=6)
    want = [wmtp.greedy_generate(target, p, 8) for p in ps]
    out, _ = lockstep_generate(target, head, ps, 8, 3, 2, 4, impl="triton")
    assert all(torch.equal(a, b) for a, b in zip(out, want))


def test_bad_requests_are_value_errors(models):
    target, head = models
    ps = prompts(2, 5)
    bad = [((ps[0], 4, 2), "non-empty \\(B, P\\)"), ((ps[None], 4, 2), "non-empty \\(B, P\\)"),
           ((ps[:, :0], 4, 2), "non-empty \\(B, P\\)"), ((ps.float(), 4, 2), "integer token ids"),
           ((torch.cat([ps, torch.full((1, 5), V)]), 4, 2), "prompts row 2: prompt token ids must lie"),  # every row
           ((ps, 4, 0), "depth"),  # checked before the prefill (mutation round 6: checking row 0 alone survived)
           ((ps, -1, 2), "max_new_tokens"), ((ps, 10_000, 2), "cache positions")]
    for (p, new, depth), match in bad:
        with pytest.raises(ValueError, match=match):
            lockstep_generate(target, head, p, new, depth)
    with pytest.raises(ValueError, match="non-empty \\(B, P\\)"):
        batched_greedy_generate(target, ps[0], 4)
    with pytest.raises(ValueError, match="window"):
        lockstep_generate(target, head, ps, 4, 2, 4, 0)
