"""Lockstep batched speculative decoding (wmtp/lockstep.py): every row equals its dense greedy
decoding token for token (float64, NOTE [Batch exactness]), for every depth, key set and impl; the
batch commits the least of its rows' matches each step, and its counters say so."""

import pytest
import torch
from decode_harness import Cycling, V

import wmtp
from wmtp.grading_checks import harness_models
from wmtp.lockstep import batched_greedy_generate, lockstep_generate

KEYSETS = [(None, None), (4, 16), (0, 8), (2, 1)]


@pytest.fixture(scope="module")
def models():
    return harness_models()


def prompts(B: int, P: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, P), generator=torch.Generator().manual_seed(seed))


class BatchOracle:
    """Row ``b`` right for its first ``j(b, n)`` drafts of the step that verifies from position
    ``n``, then wrong: ``j(b, n) = (7 n + b) % (K + 1)``, so rows and steps differ. Draft ``i`` of a
    step sits at position ``n - 1 + i`` and guesses the token at ``n + 1 + i`` of its row's
    ``sequence`` (prompt and greedy continuation); its hidden output carries ``i`` (``SENTINEL + i``)."""

    SENTINEL = 1e6

    def __init__(self, head, sequences: torch.Tensor, depth: int):
        self.head, self.seq, self.K = head, sequences, depth
        self.calls = 0

    def j(self, b: int, n: int) -> int:
        return (7 * n + b) % (self.K + 1)

    def new_cache(self, *args, **kwargs):
        return self.head.new_cache(*args, **kwargs)

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        self.calls += 1
        B, L, _ = hidden.shape
        lead = hidden[:, :, 0]  # (B, L)
        index = torch.where(lead >= self.SENTINEL, (lead - self.SENTINEL).long() + 1, torch.zeros_like(lead).long())
        truth = self.seq[:, (pos + 2).clamp(max=self.seq.shape[1] - 1)]  # (B, L)
        n = pos[None, :] - index + 1  # (B, L): the step's verify position, for the rows that draft
        j = (7 * n + torch.arange(B)[:, None]) % (self.K + 1)
        tok = torch.where(index < j, truth, (truth + 1) % V)
        logits = torch.zeros(B, L, V, dtype=hidden.dtype).scatter_(2, tok[..., None], 1.0)
        g = (index.to(hidden.dtype) + self.SENTINEL)[..., None].expand_as(hidden).contiguous()
        return logits, g


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
    want = [wmtp.greedy_generate(target, p, new + depth) for p in ps]
    oracle = BatchOracle(head, torch.cat([ps, torch.stack(want)], dim=1), depth)
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
    assert 0 < stats.lockstep_efficiency < 1  # the rows' matches differ
    assert oracle.calls == 1 + steps * depth  # the prompt's chain, then an extend and depth - 1 drafts a step


def test_a_depth_policy_drafts_each_steps_depth_and_learns_the_batchs_match(models):
    """A scripted policy: each step drafts its depth, and the policy is told the step's m (the
    batch's least match, as the oracle implies), never a row's own."""
    target, head = models
    B, P, new = 3, 9, 40
    ps = prompts(B, P, seed=7)
    want = [wmtp.greedy_generate(target, p, new + 4) for p in ps]
    oracle = BatchOracle(head, torch.cat([ps, torch.stack(want)], dim=1), 4)
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


def test_rows_that_match_alike_lose_nothing(models):
    target, head = models
    ps = prompts(1, 10, seed=3).repeat(4, 1)  # four copies of one prompt
    out, stats = lockstep_generate(target, head, ps, 20, 3, 4, 16)
    solo, solo_stats = wmtp.speculative_generate(target, head, ps[0], 20, 3, 4, 16)
    assert all(torch.equal(o, solo) for o in out)
    assert stats.lockstep_efficiency == 1.0 and stats.accepted == solo_stats.accepted
    assert stats.steps == solo_stats.steps


class Recorder:
    """The head, recording each call's positions, logits and hidden output."""

    def __init__(self, head):
        self.head, self.calls = head, []

    def new_cache(self, *args, **kwargs):
        return self.head.new_cache(*args, **kwargs)

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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the Triton kernels on the GPU")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_every_row_is_its_dense_greedy_decoding_on_cuda(models, impl):
    target, head = (m.cuda() for m in models)
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
           ((torch.cat([ps, torch.full((1, 5), V)]), 4, 2), "token ids must lie"), ((ps, 4, 0), "depth"),
           ((ps, -1, 2), "max_new_tokens"), ((ps, 10_000, 2), "cache positions")]
    for (p, new, depth), match in bad:
        with pytest.raises(ValueError, match=match):
            lockstep_generate(target, head, p, new, depth)
    with pytest.raises(ValueError, match="non-empty \\(B, P\\)"):
        batched_greedy_generate(target, ps[0], 4)
    with pytest.raises(ValueError, match="window"):
        lockstep_generate(target, head, ps, 4, 2, 4, 0)
