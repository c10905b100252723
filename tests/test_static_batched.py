"""Batches with a position a row and device-resident steps (wmtp/static_batched.py): the outputs and
counters of wmtp/batched.py's eager loop, token for token and counter for counter (float64, the
CPU without graphs; on CUDA with graphs, each row its prompt's greedy decoding)."""

import copy
import os

import pytest
import torch
from decode_harness import Cycling, HeadProxy, InputOracle, StepClock, V, prompts_of

import wmtp
from wmtp import graphs
from wmtp.batched import batched_speculative_generate
from wmtp.grading_checks import harness_models
from wmtp.static_batched import static_batched_speculative_generate

COUNTERS = ("depth", "batch", "steps", "accepted", "committed", "live_steps", "steps_by_depth", "draft_keys_read")


@pytest.fixture(scope="module")
def models():
    return harness_models()


def assert_same_run(a, b):
    (outs_a, stats_a), (outs_b, stats_b) = a, b
    assert len(outs_a) == len(outs_b) and all(torch.equal(x, y) for x, y in zip(outs_a, outs_b))
    for key in COUNTERS:
        assert getattr(stats_a, key) == getattr(stats_b, key), key


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("n_sink, window", [(None, None), (2, 8)])
def test_the_static_loop_is_the_eager_one(models, n_sink, window, depth):
    """The real head (its drafts depend on everything it is fed) on prompts of 3, 17 and 9 tokens."""
    target, head = models
    prompts = prompts_of([3, 17, 9], seed=depth)
    eager = batched_speculative_generate(target, head, prompts, 20, depth, n_sink, window, impl="torch")
    assert_same_run(static_batched_speculative_generate(target, head, prompts, 20, depth, n_sink, window,
                                                        impl="torch"), eager)


@pytest.mark.parametrize("stop", ["eos", "max_new_tokens"])
def test_scripted_matches_and_stops(models, stop):
    """``InputOracle``: row 0 matches every draft, row 1 none, row 2 its script's; row 0 stops first (its
    ``eos_id``, or ``max_new_tokens``) and sits at the positions after its last step, past the eager
    loop's, inside the static loop's larger caches (unchecked: a write past them would be an error).
    A depth policy is asked at the least position of the live rows: rows from 8, 8 and 5 keep
    ``j + 1`` tokens a step (row 2's ``n`` stays 1 mod 4, so its j is 3), so step 0 asks at 5 and
    step ``s >= 1`` at row 1's ``8 + s``; row 0, stopped at 12 by its eos, must not count."""
    target, head = models
    K, new, prompts = 3, 30, prompts_of([8, 8, 5], seed=9)
    j = lambda b, n: K if b == 0 else 0 if b == 1 else (3 * n) % (K + 1)  # noqa: E731
    oracle = InputOracle(target, head, prompts, K, new, j=j)
    eos = int(oracle.want[0][K + 1]) if stop == "eos" else None
    assert eos is None or eos not in oracle.want[0][: K + 1].tolist() + oracle.want[1][:new].tolist() + \
        oracle.want[2][:new].tolist()
    policies = Cycling([K]), Cycling([K])  # depth K every step, the positions asked at recorded
    eager = batched_speculative_generate(target, InputOracle(target, head, prompts, K, new, j=j), prompts, new,
                                         policies[0], impl="torch", eos_id=eos)
    static = static_batched_speculative_generate(target, oracle, prompts, new, policies[1], impl="torch", eos_id=eos)
    assert_same_run(static, eager)
    assert policies[0].positions == policies[1].positions == [5, *range(9, 8 + new - 1)]
    # each live row's own accepted count, as the eager loop tells it (step 0: rows 0, 1, 2 accept 3, 0, 3;
    # telling every row the batch's most, or row 0's, survived, session 54)
    assert policies[1].seen == policies[0].seen and policies[1].seen[:3] == [(K, K), (K, 0), (K, K)]
    assert static[1].live_steps[0] < static[1].live_steps[1] and static[1].mean_accept_length > 1.5


def test_step_times_are_the_spans_of_its_two_phases(models, monkeypatch):
    """The loop's clock (graphs.Clock) reads a fake ``perf_counter`` three times a step: step s's draft
    phase spans 3s+1, its verify phase 3s+2, in the counters and as the depth policy hears them, once a
    live row (3 rows at step 0) (mutation round 5: the two times swapped survived every test)."""
    target, head = models
    monkeypatch.setattr(graphs, "time", StepClock())
    policy = Cycling([2])
    _, stats = static_batched_speculative_generate(target, head, prompts_of([3, 17, 9], seed=1), 10, policy,
                                                   impl="torch")
    assert stats.steps >= 4
    assert stats.draft_times_s == [3 * s + 1 for s in range(stats.steps)]
    assert stats.verify_times_s == [3 * s + 2 for s in range(stats.steps)]
    assert policy.times[:3] == [(1, 2)] * 3 and policy.times[-1] == (3 * stats.steps - 2, 3 * stats.steps - 1)


class RowZeroOracle(HeadProxy):
    """The real head's caches, its logits scripted: row 0's every draft right (at position t it guesses
    the token at t + 2 of its prompt and greedy tokens), every other row's wrong."""

    def __init__(self, head, seqs: torch.Tensor):
        self.head, self.seqs = head, seqs  # (B, T)

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        B, L = next_ids.shape
        truth = self.seqs.gather(1, (pos.expand(B, L) + 2).clamp(max=self.seqs.shape[1] - 1))  # (B, L)
        tok = torch.where(torch.arange(B)[:, None] == 0, truth, (truth + 1) % V)
        return torch.nn.functional.one_hot(tok, V).to(hidden.dtype), hidden


def test_a_stopped_row_that_accepted_more_than_a_later_extend_holds(models):
    """Depths 3, 3, 1, 1 a policy update (so 3, 1, 3, 1 a step while both rows live): row 0 accepts
    every draft, 3 + 1 + 3 + 1 + 3 + 1 + 3 + 1 + 3 = 19 in 9 steps, and stops (1 + 28 tokens) after a
    depth-3 step, a_0 = 3; row 1 accepts none, 28 steps. After a depth-1 step the extend has 2 rows:
    row 0's a_0 = 3 is clamped to row 1, inside them (mutation round 5: clamping to e, an index one
    past the extend, survived every test)."""
    target, head = models
    prompts = prompts_of([8, 8], seed=9)
    seqs = torch.stack([torch.cat([p, wmtp.greedy_generate(target, p, 40, impl="torch")]) for p in prompts])
    runs = [generate(target, RowZeroOracle(head, seqs), prompts, 29, Cycling([3, 3, 1, 1]), impl="torch")
            for generate in (static_batched_speculative_generate, batched_speculative_generate)]
    assert_same_run(*runs)
    outs, stats = runs[0]
    assert [o.tolist() for o in outs] == [s[8:37].tolist() for s in seqs]
    assert (stats.live_steps, stats.accepted, stats.committed) == ([9, 28], [19, 0], [28, 28])


class Widths(HeadProxy):
    """The real head, recording the positions ``L`` of each call: an extend's rows, then 1 a recursive draft."""

    def __init__(self, head):
        self.head, self.widths = head, []

    def __call__(self, hidden, next_ids, *args):
        self.widths.append(next_ids.shape[1])
        return self.head(hidden, next_ids, *args)


def test_an_extend_runs_the_last_steps_rows(models):
    """Depths 3, 2, 1, 3, ... a step (the policy hears each live row; 7 steps, both rows live): the
    first extend runs the prefill's one row, each later one the last step's ``k + 1`` rows, not
    ``K + 1`` (their drafts are the same, so only the calls' widths show it: an extend of ``K + 1``
    rows every step, or at the first, survived every test), then ``k - 1`` recursive drafts of one
    position."""
    target, head = models
    prompts, widths = prompts_of([5, 9], seed=3), Widths(head)
    run = static_batched_speculative_generate(target, widths, prompts, 8, Cycling([3, 3, 2, 2, 1, 1]), impl="torch")
    assert_same_run(run, batched_speculative_generate(target, head, prompts, 8, Cycling([3, 3, 2, 2, 1, 1]),
                                                      impl="torch"))
    assert run[1].steps == 7 and widths.widths == [1, 1, 1, 4, 1, 3, 2, 1, 1, 4, 1, 3, 2, 1, 1]


def test_a_depth_policy_and_short_requests(models):
    target, head = models
    prompts = prompts_of([1, 6, 11], seed=4)
    for new in (0, 1, 2, 9):
        assert_same_run(static_batched_speculative_generate(target, head, prompts, new, wmtp.AdaptiveDepth(4), 2, 8,
                                                            impl="torch"),
                        batched_speculative_generate(target, head, prompts, new, wmtp.AdaptiveDepth(4), 2, 8,
                                                     impl="torch"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the graphs and the Triton kernels")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_each_row_is_its_prompt_alone_on_cuda(impl):
    """With the Triton impl the phases run as CUDA graphs (float64)."""
    target, head = (m.cuda() for m in copy.deepcopy(harness_models()))
    prompts = [p.cuda() for p in prompts_of([4, 30, 17], seed=7)]
    outs, stats = static_batched_speculative_generate(target, head, prompts, 20, 4, 4, 16, impl=impl)
    assert all(torch.equal(o, wmtp.greedy_generate(target, p, 20, impl=impl)) for o, p in zip(outs, prompts))
    eager = batched_speculative_generate(target, head, prompts, 20, 4, 4, 16, impl=impl)
    assert stats.accepted == eager[1].accepted and stats.live_steps == eager[1].live_steps


def test_triton_under_the_interpreter(models):
    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("the Triton kernels under the CPU interpreter")
    target, head = models
    prompts = prompts_of([3, 10], seed=8)
    assert_same_run(static_batched_speculative_generate(target, head, prompts, 8, 3, 2, 4, impl="triton"),
                    batched_speculative_generate(target, head, prompts, 8, 3, 2, 4, impl="torch"))


def test_bad_requests_are_value_errors(models):
    target, head = models
    with pytest.raises(ValueError, match="non-empty"):
        static_batched_speculative_generate(target, head, [], 4, 2)
    with pytest.raises(ValueError, match="depth"):
        static_batched_speculative_generate(target, head, prompts_of([3]), 4, 0)
    with pytest.raises(ValueError, match="cuda_graph"):
        static_batched_speculative_generate(target, head, prompts_of([3]), 4, 2, cuda_graph="yes")
