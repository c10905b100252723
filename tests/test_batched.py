"""Batched speculative decoding with a position a row (wmtp/batched.py): prompts of different
lengths in one batch, each row keeping its own matches, must give each prompt's dense greedy
decoding alone, token for token, and accept what ``speculative_generate`` of the prompt alone
accepts. float64 on the CPU, reference ops (NOTE [Batch exactness] in wmtp/lockstep.py)."""

import copy
import os

import pytest
import torch
from decode_harness import Cycling, HeadProxy, InputOracle, StepClock, prompts_of, scripted_counts

import wmtp
from wmtp import batched
from wmtp.batched import batched_speculative_generate
from wmtp.policy import AdaptiveDepth


@pytest.fixture(scope="module")
def models():
    target, head = wmtp.build_models("tiny", seed=0)
    return target.double(), head.double()


@pytest.mark.parametrize("depth", [1, 2, 4])
@pytest.mark.parametrize("n_sink, window", [(None, None), (2, 8), (0, 4)])
def test_each_row_is_its_prompt_alone(models, depth, n_sink, window):
    """Prompts of 1, 9, 23 and 17 tokens: every row is ``greedy_generate`` of its prompt, and its
    accepted drafts and kept tokens are ``speculative_generate``'s for the prompt alone."""
    target, head = models
    prompts = prompts_of([1, 9, 23, 17])
    outs, stats = batched_speculative_generate(target, head, prompts, 24, depth, n_sink, window, impl="torch")
    for b, p in enumerate(prompts):
        assert torch.equal(outs[b], wmtp.greedy_generate(target, p, 24, impl="torch"))
        alone, s = wmtp.speculative_generate(target, head, p, 24, depth, n_sink, window, impl="torch")
        assert torch.equal(outs[b], alone)
        assert (stats.accepted[b], stats.committed[b], stats.live_steps[b]) == (s.accepted, s.committed, s.steps)
    assert stats.steps == max(stats.live_steps) and sum(stats.committed) == sum(len(o) - 1 for o in outs)
    assert stats.mean_accept_length == sum(stats.committed) / sum(stats.live_steps)


@pytest.mark.parametrize("n_sink, window", [(None, None), (2, 8)])
def test_each_row_keeps_its_own_matches(models, n_sink, window):
    """With scripted matches (``InputOracle``) on prompts of 5, 9 and 14 tokens: each step keeps
    ``j(b, n_b) + 1`` tokens of row ``b`` at its own ``n_b``, which holds only if the loop feeds each
    row's head its true tokens and hidden states; the rows' outputs are their greedy decodings and
    the counters the sums the script implies."""
    target, head = models
    K, new, prompts = 3, 30, prompts_of([5, 9, 14], seed=5)
    oracle = InputOracle(target, head, prompts, K, new)
    outs, stats = batched_speculative_generate(target, oracle, prompts, new, K, n_sink, window, impl="torch")
    assert all(torch.equal(o, w[:new]) for o, w in zip(outs, oracle.want))
    for b, p in enumerate(prompts):
        steps, accepted = scripted_counts(oracle.j, b, p.numel(), new)
        assert (stats.live_steps[b], stats.accepted[b], stats.committed[b]) == (steps, accepted, new - 1)
    assert len(set(stats.accepted)) > 1 and stats.steps == max(stats.live_steps)  # the rows drift apart
    assert stats.mean_accept_length > 1.5  # the script accepts, unlike the untrained head


@pytest.mark.parametrize("stop", ["eos", "max_new_tokens"])
def test_a_stopped_row_stays_where_it_stopped(stop):
    """Row 0 matches every draft and row 1 none (a step a token). Row 0 stops after its first step
    (its ``eos_id``) or when it has ``max_new_tokens`` (past them by up to K); row 1 goes on. Had row
    0 moved past its last live step's positions, its next passes would have written past its cache
    (checked). The harness models (wide weights): the tiny target's greedy tokens repeat, and the
    eos stop needs a token new to both rows. A depth policy is asked at the least position of the
    live rows: row 1's, ``8 + s`` at step ``s`` (row 0, live, is ahead of it; stopped, it sits at 8
    in the eos case, which must not count)."""
    from wmtp.grading_checks import harness_models

    target, head = harness_models()
    K, new, prompts = 3, 30, prompts_of([8, 8], seed=9)
    oracle = InputOracle(target, head, prompts, K, new, j=lambda b, n: K if b == 0 else 0)
    eos = int(oracle.want[0][K + 1]) if stop == "eos" else None  # row 0's last token of its first step
    assert eos is None or eos not in oracle.want[0][: K + 1].tolist() + oracle.want[1][:new].tolist()
    policy = Cycling([K])  # depth K every step, the positions it is asked at recorded
    outs, stats = batched_speculative_generate(target, oracle, prompts, new, policy, impl="torch", eos_id=eos)
    assert torch.equal(outs[0], oracle.want[0][: K + 2 if eos else new]) and torch.equal(outs[1], oracle.want[1][:new])
    assert policy.positions == list(range(8, 8 + new - 1))
    assert stats.live_steps == [1 if eos else -(-(new - 1) // (K + 1)), new - 1] and stats.steps == new - 1


def test_rows_that_stop_early_run_on_without_changing(models):
    """A row that reaches its ``eos_id`` stops (the token included) while the others go on; a
    ``(B, P)`` tensor of prompts works as the list of its rows."""
    target, head = models
    prompts = torch.stack(prompts_of([12, 12, 12], seed=3))
    free = [wmtp.greedy_generate(target, p, 20, impl="torch") for p in prompts]
    eos = int(free[1][4])  # row 1 stops at its fifth token (or earlier, if that token came before)
    outs, stats = batched_speculative_generate(target, head, prompts, 20, 3, 2, 8, impl="torch", eos_id=eos)
    for b, p in enumerate(prompts):
        assert torch.equal(outs[b], wmtp.greedy_generate(target, p, 20, eos_id=eos, impl="torch"))
    assert len(outs[1]) <= 5 and stats.live_steps[1] < stats.steps


def test_a_depth_policy_changes_the_drafts_not_the_output(models):
    target, head = models
    prompts = prompts_of([5, 30, 14], seed=4)
    outs, stats = batched_speculative_generate(target, head, prompts, 30, AdaptiveDepth(4), 2, 8, impl="torch")
    for b, p in enumerate(prompts):
        assert torch.equal(outs[b], wmtp.greedy_generate(target, p, 30, impl="torch"))
    assert sum(stats.steps_by_depth) == stats.steps


def test_short_requests(models):
    """One-token prompts (no true chain for the head) beside a longer one; 0, 1, 2 and 7 new tokens."""
    target, head = models
    prompts = prompts_of([1, 1, 6], seed=6)
    for new in (0, 1, 2, 7):
        outs, stats = batched_speculative_generate(target, head, prompts, new, 3, 2, 8, impl="torch")
        assert [o.tolist() for o in outs] == [wmtp.greedy_generate(target, p, new, impl="torch").tolist()
                                              for p in prompts]
        assert stats.committed == [max(new - 1, 0)] * 3 and (new > 1 or stats.steps == 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the Triton kernels on the GPU")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_each_row_is_its_prompt_alone_on_cuda(impl):
    """The harness models (wide weights: varied greedy output) in float64 on the GPU, the Triton
    kernels taking a position a row in every pass."""
    from wmtp.grading_checks import harness_models

    target, head = (m.cuda() for m in copy.deepcopy(harness_models()))
    prompts = [p.cuda() for p in prompts_of([4, 30, 17], seed=7)]
    outs, _ = batched_speculative_generate(target, head, prompts, 20, 4, 4, 16, impl=impl)
    assert all(torch.equal(o, wmtp.greedy_generate(target, p, 20, impl=impl)) for o, p in zip(outs, prompts))


def test_triton_under_the_interpreter(models):
    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("the Triton kernels under the CPU interpreter")
    target, head = models
    prompts = prompts_of([3, 10], seed=8)
    outs, _ = batched_speculative_generate(target, head, prompts, 8, 3, 2, 4, impl="triton")
    assert all(torch.equal(o, wmtp.greedy_generate(target, p, 8, impl="torch")) for o, p in zip(outs, prompts))


@pytest.mark.parametrize("prompts, match", [
    ([], "non-empty"), (torch.zeros(3, dtype=torch.long), "non-empty"), ([torch.zeros(0, dtype=torch.long)], "row 0"),
    ([torch.zeros(2, dtype=torch.long), torch.zeros(2, 2, dtype=torch.long)], "row 1"),
    ([torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long, device="meta")], "one device"),
])
def test_bad_prompts_are_value_errors(models, prompts, match):
    target, head = models
    with pytest.raises(ValueError, match=match):
        batched_speculative_generate(target, head, prompts, 8, 2, impl="torch")


class PositionLog(HeadProxy):
    """A draft that logs each call's positions, a list a batch row (mutation round 7)."""

    def __init__(self, head):
        self.head, self.calls = head, []

    def __call__(self, hidden, next_ids, pos, *rest):
        self.calls.append(pos.expand(next_ids.shape).tolist())
        return self.head(hidden, next_ids, pos, *rest)


def _one_row_stops():
    """Two prompts of 8 tokens, depth 3, 6 new tokens: row 0's drafts all right, row 1's all wrong."""
    from wmtp.grading_checks import harness_models

    target, head = harness_models()
    K, new, prompts = 3, 6, prompts_of([8, 8], seed=9)
    return target, K, new, prompts, InputOracle(target, head, prompts, K, new, j=lambda b, n: K if b == 0 else 0)


def test_a_stopped_row_runs_on_at_its_last_live_steps_positions():
    """Two prompts of 8 tokens, depth 3: row 0 matches every draft and stops at its eos, the last
    token of its first step; row 1 matches none and goes on for 5 steps. Every step's passes, literal:
    row 0's repeat its first step's positions (head extend 7, drafts at 8 and 9, verify 8..11), row
    1's move on a position a step. (Mutation round 7: the stopped row's extend moving on to 8, and
    its extend width taking the dropped step's matches, survived test_batched and test_refill; its
    output alone cannot show where it runs.)"""
    target, K, new, prompts, oracle = _one_row_stops()
    eos = int(oracle.want[0][K + 1])
    assert eos not in oracle.want[0][: K + 1].tolist() + oracle.want[1][:new].tolist()
    draft, verified = PositionLog(oracle), []
    hook = target.register_forward_hook(lambda m, args, out: verified.append(args[1].expand(args[0].shape).tolist()))
    try:
        outs, stats = batched_speculative_generate(target, draft, prompts, new, K, impl="torch", eos_id=eos)
    finally:
        hook.remove()
    assert torch.equal(outs[0], oracle.want[0][: K + 2]) and torch.equal(outs[1], oracle.want[1][:new])
    assert stats.live_steps == [1, 5] and stats.steps == 5 and stats.accepted == [3, 0]
    assert draft.calls == [c for s in range(5) for c in ([[7], [7 + s]], [[8], [8 + s]], [[9], [9 + s]])]
    assert verified[1:] == [[[8, 9, 10, 11], list(range(8 + s, 12 + s))] for s in range(5)]  # [0]: the prefill


def test_the_policy_hears_each_live_rows_step_and_its_phases(monkeypatch):
    """On a fake clock (``StepClock``: step ``s``'s draft phase spans ``3 s + 1``, its verify phase
    ``3 s + 2``) the batch of the test above: ``BatchedStats`` keeps each step's phases, and the depth
    policy hears (depth, accepted) and those phases once a live row, literal: both rows at step 0,
    (3, 3) and (3, 0); row 1 alone after. (Mutation round 7: the phases swapped in add_step, and no
    policy.update, survived test_batched and test_refill.)"""
    target, K, new, prompts, oracle = _one_row_stops()
    monkeypatch.setattr(batched, "time", StepClock())
    policy = Cycling([K])
    _, stats = batched_speculative_generate(target, oracle, prompts, new, policy, impl="torch",
                                            eos_id=int(oracle.want[0][K + 1]))
    assert stats.draft_times_s == [1, 4, 7, 10, 13] and stats.verify_times_s == [2, 5, 8, 11, 14]
    assert policy.seen == [(3, 3), (3, 0)] + [(3, 0)] * 4
    assert policy.times == [(1, 2), (1, 2), (4, 5), (7, 8), (10, 11), (13, 14)]
