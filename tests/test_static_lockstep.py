"""Lockstep batches with device-resident steps (wmtp/static_lockstep.py): both loops equal the eager
ones of wmtp/lockstep.py token for token and counter for counter (float64, lockstep.py NOTE [Batch
exactness]), for every depth, key set, policy, eos and impl; a batch of one counts as
static_speculative_generate does."""

import copy

import pytest
import torch
from decode_harness import Cycling, HeadProxy, StepClock, V
from decode_harness import random_prompts as prompts

import wmtp
from wmtp.grading_checks import harness_models
from wmtp.lockstep import batched_greedy_generate, lockstep_generate
from wmtp.static_lockstep import static_batched_greedy_generate, static_lockstep_generate

KEYSETS = [(None, None), (4, 16), (0, 8), (2, 1)]
COUNTERS = ("depth", "batch", "steps", "committed", "accepted", "accepted_alone", "live_steps", "kept_live",
            "steps_by_depth")


@pytest.fixture(scope="module")
def models():
    return harness_models()


class PositionOracle(HeadProxy):
    """The real head with its logits replaced: the head at position ``t`` guesses the token at
    ``t + 2`` (draft ``i`` of a step from ``n`` sits at ``n - 2 + i``; the extend's row at ``n - 1``
    drafts the first), right when ``right(b, t)`` and the real head's own choice there is not a
    multiple of 3, else one off. The drafts then depend on the row and position, which both loops'
    calls must agree on, and on the real head's output, so on the hidden states and tokens it is fed
    (a wrong row's hidden state changes the matches); the cache writes are the head's own."""

    def __init__(self, head, sequences: torch.Tensor, right):
        self.head, self.seq, self.right = head, sequences, right

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        logits, g = self.head(hidden, next_ids, pos, cache, n_sink, window, impl)  # (B, L, V)
        t = pos.tolist()
        truth = self.seq[:, [min(x + 2, self.seq.shape[1] - 1) for x in t]]  # (B, L)
        right = torch.tensor([[self.right(b, x) for x in t] for b in range(hidden.shape[0])])  # (B, L)
        right &= logits.argmax(-1) % 3 != 0  # the real head's say
        out = torch.zeros_like(logits)
        out.scatter_(2, torch.where(right, truth, (truth + 1) % V)[..., None], 1.0)
        return out, g


def oracle(target, head, ps, new, right=lambda b, t: (5 * t + 3 * b) % 7 != 0):
    """A ``PositionOracle`` over each prompt's greedy continuation (default: most drafts right, the
    rows' misses at different positions)."""
    more = torch.stack([wmtp.greedy_generate(target, p, new + 10) for p in ps])
    return PositionOracle(head, torch.cat([ps, more], dim=1), right)


def assert_same_run(a, b):
    (out_a, stats_a), (out_b, stats_b) = a, b
    assert [o.tolist() for o in out_a] == [o.tolist() for o in out_b]
    assert {c: getattr(stats_a, c) for c in COUNTERS} == {c: getattr(stats_b, c) for c in COUNTERS}


@pytest.mark.parametrize("max_new", [0, 1, 2, 17, 40])
@pytest.mark.parametrize("B", [1, 3])
def test_the_dense_batch_is_the_eager_one(models, B, max_new):
    target, _ = models
    ps = prompts(B, 9, seed=B)
    free = batched_greedy_generate(target, ps, 40)
    for eos in (None, int(free[-1][min(16, max(max_new - 1, 0))])):  # the last row stops at or before the end
        times: list[float] = []
        out = static_batched_greedy_generate(target, ps, max_new, eos_id=eos, step_times=times)
        want = batched_greedy_generate(target, ps, max_new, eos_id=eos)
        assert [o.tolist() for o in out] == [w.tolist() for w in want]
        assert len(times) <= max(max_new - 1, 0) and all(t > 0 for t in times)


@pytest.mark.parametrize("depth", [1, 3, 6])
@pytest.mark.parametrize("n_sink, window", KEYSETS)
@pytest.mark.parametrize("B", [1, 3])
def test_lockstep_is_the_eager_loop(models, B, n_sink, window, depth):
    """Drafts that mostly match, the rows missing at different positions: every token and counter."""
    target, head = models
    ps = prompts(B, 12, seed=B + depth)
    head_o = oracle(target, head, ps, 30)
    eager = lockstep_generate(target, head_o, ps, 30, depth, n_sink, window)
    static = static_lockstep_generate(target, head_o, ps, 30, depth, n_sink, window)
    assert_same_run(static, eager)
    assert static[1].accepted > 0 and all(torch.equal(o, greedy) for o, greedy in
                                          zip(static[0], (wmtp.greedy_generate(target, p, 30) for p in ps)))
    assert B == 1 or static[1].lockstep_efficiency < 1.0  # the rows' misses cost the batch
    assert all(len(st.prefill_times_s) == 1 and st.prefill_times_s[0] > 0 for st in (eager[1], static[1]))


def test_the_real_head_and_a_policy_with_eos(models):
    """The harness head itself, depths cycling, one row stopping early: the eager loop's run."""
    target, head = models
    ps = prompts(3, 10, seed=21)
    eos = int(wmtp.greedy_generate(target, ps[1], 30)[6])
    for h in (head, oracle(target, head, ps, 30)):
        eager_p, static_p = Cycling([2, 5, 1, 4]), Cycling([2, 5, 1, 4])
        eager = lockstep_generate(target, h, ps, 30, eager_p, 4, 16, eos_id=eos)
        static = static_lockstep_generate(target, h, ps, 30, static_p, 4, 16, eos_id=eos)
        assert_same_run(static, eager)
        assert static_p.seen == eager_p.seen and static_p.positions == eager_p.positions
        assert len(static[0][1]) <= 7 and static[1].live_steps[1] < static[1].steps


@pytest.mark.parametrize("n_sink, window", [(None, None), (2, 8)])
def test_a_batch_of_one_counts_as_static_speculative_generate(models, n_sink, window):
    """The same steps, matches, tokens and draft keys (both count the extend's k + 1 rows)."""
    target, head = models
    ps = prompts(1, 10, seed=12)
    head_o = oracle(target, head, ps, 30)
    out, lock = static_lockstep_generate(target, head_o, ps, 30, 5, n_sink, window)
    alone_out, alone = wmtp.static_speculative_generate(target, head_o, ps[0], 30, 5, n_sink, window)
    assert torch.equal(out[0], alone_out) and alone.accepted > 0
    assert (lock.steps, lock.accepted, lock.committed, lock.draft_keys_read) == (
        alone.steps, alone.accepted, alone.committed, alone.draft_keys_read)
    # two copies of the prompt under a depth policy: one row's keys, each step's own extend and depth (a
    # count of every row, or of this step's width for the last step's extend, survived: session 54)
    twice, same = ps.expand(2, -1), lambda b, t: (5 * t) % 7 != 0  # the same misses in both rows
    policies = Cycling([3, 1, 5]), Cycling([3, 1, 5])
    _, lock = static_lockstep_generate(target, oracle(target, head, twice, 30, same), twice, 30, policies[0],
                                       n_sink, window)
    _, alone = wmtp.static_speculative_generate(target, oracle(target, head, ps, 30, same), ps[0], 30, policies[1],
                                                n_sink, window)
    assert policies[0].seen == policies[1].seen and alone.accepted > 0
    assert lock.draft_keys_read == alone.draft_keys_read


def test_the_capture_warm_up_and_restore_change_nothing(models, monkeypatch):
    """The CPU has no graphs: a runner that runs each phase once at capture (its warm-up) and
    restores the state, as wmtp/graphs.py's does, then runs the phase itself on every call. Depths
    cycle (new phases captured mid-run) and a row stops early: the eager loop's run."""
    import wmtp.graphs as graphs
    import wmtp.static_lockstep as sl

    def warm_then_restore(step, state, graph, pool=None):
        saved = [t.clone() for t in state]
        step()
        for t, s in zip(state, saved):
            t.copy_(s)
        return step

    monkeypatch.setattr(graphs, "runner", warm_then_restore)  # the phases capture through graphs.Phases
    target, head = models
    ps = prompts(3, 10, seed=21)
    eos = int(wmtp.greedy_generate(target, ps[1], 30)[6])
    head_o = oracle(target, head, ps, 30)
    static = sl.static_lockstep_generate(target, head_o, ps, 30, Cycling([2, 5, 1, 4]), 4, 16, eos_id=eos)
    assert_same_run(static, lockstep_generate(target, head_o, ps, 30, Cycling([2, 5, 1, 4]), 4, 16, eos_id=eos))
    assert static[1].accepted > 0 and static[1].live_steps[1] < static[1].steps
    dense = sl.static_batched_greedy_generate(target, ps, 30, eos_id=eos)
    assert [o.tolist() for o in dense] == [o.tolist() for o in batched_greedy_generate(target, ps, 30, eos_id=eos)]


def test_short_requests(models):
    target, head = models
    ps = prompts(2, 1, seed=2)  # one-token prompts: no true chain for the head
    for new in (0, 1, 2, 7):
        want = [wmtp.greedy_generate(target, p, new).tolist() for p in ps]
        out, stats = static_lockstep_generate(target, head, ps, new, 4)
        assert [o.tolist() for o in out] == want and stats.committed == max(new - 1, 0)
        assert [o.tolist() for o in static_batched_greedy_generate(target, ps, new)] == want


def test_the_policy_hears_each_steps_phases(models, monkeypatch):
    """On a fake clock (``StepClock``: step ``s``'s draft phase spans ``3 s + 1``, its verify phase
    ``3 s + 2``) the counters keep each step's phases and the depth policy hears them in that order
    (mutation round 7: policy.update told verify, draft survived test_static_lockstep)."""
    from wmtp import graphs

    target, head = models
    monkeypatch.setattr(graphs, "time", StepClock())
    policy = Cycling([2])
    _, stats = static_lockstep_generate(target, head, prompts(2, 5, seed=3), 6, policy)
    assert stats.steps == 5 and stats.draft_times_s == [1, 4, 7, 10, 13] and stats.verify_times_s == [2, 5, 8, 11, 14]
    assert policy.times == [(1, 2), (4, 5), (7, 8), (10, 11), (13, 14)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the Triton kernels in CUDA graphs")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_every_row_is_its_dense_greedy_decoding_on_cuda(impl):
    # copies: harness_models() is cached, and Module.cuda() moves it in place for every later test in this process
    target, head = (m.cuda() for m in copy.deepcopy(harness_models()))
    ps = prompts(3, 30, seed=4).cuda()
    want = [wmtp.greedy_generate(target, p, 24, impl=impl).tolist() for p in ps]
    eos = want[2][9]
    cut = [w[: w.index(eos) + 1] if eos in w else w for w in want]
    eager = lockstep_generate(target, head, ps, 24, Cycling([3, 1, 4]), 4, 16, impl=impl, eos_id=eos)
    for graph in ([False, True] if impl == "triton" else [False]):
        out, stats = static_lockstep_generate(target, head, ps, 24, 4, 4, 16, impl=impl, cuda_graph=graph)
        assert [o.tolist() for o in out] == want and stats.steps > 0
        run = static_lockstep_generate(target, head, ps, 24, Cycling([3, 1, 4]), 4, 16, impl=impl, eos_id=eos,
                                       cuda_graph=graph)
        assert_same_run(run, eager)
        assert [o.tolist() for o in run[0]] == cut
        out = static_batched_greedy_generate(target, ps, 24, eos_id=eos, impl=impl, cuda_graph=graph)
        assert [o.tolist() for o in out] == cut


def test_triton_under_the_interpreter(models):
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("the Triton kernels under the CPU interpreter")
    target, head = models
    ps = prompts(2, 10, seed=6)
    want = [wmtp.greedy_generate(target, p, 8).tolist() for p in ps]
    out, _ = static_lockstep_generate(target, head, ps, 8, 3, 2, 4, impl="triton")
    assert [o.tolist() for o in out] == want


def test_bad_requests_are_value_errors(models):
    target, head = models
    ps = prompts(2, 5)
    for call in (lambda **kw: static_lockstep_generate(target, head, ps, 4, 2, **kw),
                 lambda **kw: static_batched_greedy_generate(target, ps, 4, **kw)):
        with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device"):
            call(cuda_graph=True)
        with pytest.raises(ValueError, match="cuda_graph must be"):
            call(cuda_graph="yes")
    with pytest.raises(ValueError, match="non-empty \\(B, P\\)"):
        static_lockstep_generate(target, head, ps[0], 4, 2)
    with pytest.raises(ValueError, match="non-empty \\(B, P\\)"):
        static_batched_greedy_generate(target, ps[0], 4)
    with pytest.raises(ValueError, match="prompts row 1"):
        static_lockstep_generate(target, head, torch.cat([ps[:1], torch.full((1, 5), V)]), 4, 2)
    with pytest.raises(ValueError, match="depth"):
        static_lockstep_generate(target, head, ps, 4, 0)
