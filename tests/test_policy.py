"""Draft-depth policies (wmtp/policy.py): the depth a step drafts never changes the output; the
adaptive policy's estimates, choices and learning follow its formulas (literal values), and it
settles on the depth an oracle draft deserves."""

import pytest
import torch
from decode_harness import Cycling, V, random_prompt

import wmtp
from wmtp import grading
from wmtp.grading import harness_models
from wmtp.policy import LINE_WEIGHT, AdaptiveDepth, FixedDepth, as_policy, best_depth

CUDA = torch.cuda.is_available()
KEYSETS = [(0, None), (4, 16), (0, 1)]


@pytest.fixture(scope="module")
def models():
    return harness_models()


@pytest.mark.parametrize("n_sink,window", KEYSETS)
def test_every_policy_is_lossless(models, n_sink, window):
    """Cycling depths 1..5 with an oracle right for j = 0..5 tokens a step, the random head with
    adaptive policies: greedy output equals dense greedy, gumbel sampling equals dense sampling."""
    target, head = models
    prompt = random_prompt(12, seed=3)
    ref = wmtp.greedy_generate(target, prompt, 40)
    seq = torch.cat([prompt, ref, torch.zeros(8, dtype=torch.long)])
    for j in range(6):
        policy = Cycling([1, 3, 5, 2, 4])
        out, stats = wmtp.speculative_generate(target, grading.OracleDraft(head, seq, j, V), prompt, 40, policy,
                                               n_sink, window)
        assert torch.equal(out, ref), j
        depths = [d for d, _ in policy.seen]
        assert depths == [[1, 3, 5, 2, 4][i % 5] for i in range(stats.steps)]
        assert all(a == min(j, d) for d, a in policy.seen[:-1])  # the oracle's j, cut at the step's depth
        assert stats.steps_by_depth == [depths.count(k) for k in range(6)]
        assert stats.proposed == sum(depths) and stats.depth == 5
        # draft queries a step: the extend's rows (the positions committed since the last step: a + 1,
        # 1 at the first step) and k - 1 recursive ones
        extends = [1] + [a + 1 for _, a in policy.seen[:-1]]
        assert stats.draft_queries == sum(e + d - 1 for e, (d, _) in zip(extends, policy.seen))
        # asked at the target's latest token's position n: 12 (the prefill's token), then n + a + 1
        # (mutation round 5: asking at n + 1 survived)
        assert policy.positions == [12 + sum(e for e in extends[1:i + 1]) for i in range(stats.steps)], j
        if j == 0:
            assert policy.positions == list(range(12, 12 + stats.steps))
    for policy in (AdaptiveDepth(6), AdaptiveDepth(3, draft_cost=0.5, decay=1.0), FixedDepth(4)):
        out, _ = wmtp.speculative_generate(target, head, prompt, 40, policy, n_sink, window)
        assert torch.equal(out, ref)
    dense = wmtp.sample_generate(target, prompt, 40, 0.8, seed=1)
    out, _ = wmtp.speculative_sample(target, head, prompt, 40, Cycling([2, 1, 4]), n_sink, window, temperature=0.8,
                                     seed=1, method="gumbel")
    assert torch.equal(out, dense)


def test_fixed_depth_is_the_int():
    policy = as_policy(3)
    assert isinstance(policy, FixedDepth) and policy.max_depth == 3 and policy.depth(100) == 3


def test_expected_tokens_and_cost_follow_the_formulas():
    policy = AdaptiveDepth(3, draft_cost=0.1, verify_cost_per_draft=0.05, prior=(1, 1))
    policy.accepts, policy.tried = [3.0, 1.0, 0.0], [4.0, 3.0, 0.0]
    # alpha_1 = (1 + 3) / (2 + 4); alpha_2 = (2 alpha_1 + 1) / (2 + 3); alpha_3 = (2 alpha_2 + 0) / (2 + 0)
    assert policy.acceptance() == pytest.approx([2 / 3, 7 / 15, 7 / 15])
    assert policy.expected_tokens(1) == pytest.approx(1 + 2 / 3)
    assert policy.expected_tokens(3) == pytest.approx(1 + 2 / 3 + 2 / 3 * 7 / 15 + 2 / 3 * 7 / 15 * 7 / 15)
    assert policy.cost(2) == pytest.approx(1.3) and policy.fitted_cost() is None
    rates = [policy.expected_tokens(k) / policy.cost(k) for k in (1, 2, 3)]
    assert rates == pytest.approx([(5 / 3) / 1.15, (89 / 45) / 1.3, (1433 / 675) / 1.45])  # 1.449, 1.521, 1.464
    assert policy.depth(0) == 2


def test_update_counts_the_verified_drafts_and_decays():
    policy = AdaptiveDepth(4, decay=0.5)
    policy.update(3, 1, 0.0, 0.0)  # draft 1 accepted, draft 2 rejected, draft 3 never verified
    assert policy.tried == [1, 1, 0, 0] and policy.accepts == [1, 0, 0, 0]
    policy.update(4, 4, 0.0, 0.0)  # all four accepted: the old counts halve first
    assert policy.tried == [1.5, 1.5, 1, 1] and policy.accepts == [1.5, 1, 1, 1]


def test_depth_follows_acceptance_and_cost():
    sure = AdaptiveDepth(6, draft_cost=0.05)
    for _ in range(50):
        sure.update(6, 6, 0.0, 0.0)  # always everything
    assert sure.depth(0) == 6
    costly = AdaptiveDepth(6, draft_cost=2.0)  # a draft dearer than a verify pass: one at a time
    for _ in range(50):
        costly.update(6, 6, 0.0, 0.0)
    assert costly.depth(0) == 1
    never = AdaptiveDepth(6)
    for _ in range(50):
        never.update(1, 0, 0.0, 0.0)
    assert never.depth(0) == 1


def test_learned_cost_is_a_line_through_the_step_times():
    policy = AdaptiveDepth(4, decay=1.0, learn_costs=True)
    policy.update(3, 1, 0.3, 0.4)  # one depth seen: no line yet, the configured costs
    assert policy.fitted_cost() is None and policy.cost(2) == pytest.approx(1.1)
    policy.update(1, 0, 0.1, 0.2)
    policy.update(1, 1, 0.2, 0.2)  # depth 1 steps of 0.3 and 0.4 s, a depth 3 step of 0.7 s
    assert policy.fitted_cost() == pytest.approx((0.175, 0.175))  # least squares: 0.35 + 0.175 (k - 5 / 3)
    assert policy.cost(4) == pytest.approx(0.875)
    falling = AdaptiveDepth(4, decay=1.0, learn_costs=True)
    falling.update(1, 0, 0.5, 0.5)
    falling.update(3, 0, 0.2, 0.2)  # deeper steps measured faster: the slope is held at 0
    assert falling.fitted_cost() == pytest.approx((0.7, 0.0))
    assert AdaptiveDepth(4).fitted_cost() is None


def test_learned_costs_decay_and_count_the_whole_step():
    """What the cost fits of a session 54 audit showed could change unseen (each a mutation every other
    test passed): the line's sums decay like the counts; ``learn_costs=False`` never fits, however many
    steps it hears; steps of one depth fit no line at the default decay, whose sums are then equal only up
    to rounding; and a depth's measured cost is its draft and its verify time."""
    decaying = AdaptiveDepth(4, decay=0.5, learn_costs=True)
    for k, seconds in ((1, 1.0), (2, 2.0), (2, 4.0)):  # weights 0.25, 0.5, 1
        decaying.update(k, 0, seconds, 0.0)
    # through (1, 1.0) and depth 2's weighted mean (0.5 * 2 + 4) / 1.5 = 10 / 3 (never forgetting: 3)
    assert decaying.fitted_cost() == pytest.approx((-4 / 3, 7 / 3))
    fixed = AdaptiveDepth(4, prior=(50, 1))  # learn_costs=False
    for k, seconds in ((1, 1.0), (3, 9.0), (4, 12.0)):
        fixed.update(k, k, seconds, 0.0)
    assert fixed.fitted_cost() is None and fixed.describe()["fitted_cost"] is None
    assert [fixed.cost(k) for k in (1, 4)] == pytest.approx([1.05, 1.2])
    assert fixed.depth(0) == 4  # the line through those steps (slope 26 / 7 s a draft) would make it 1
    one_depth = AdaptiveDepth(4, learn_costs=True, cost_model="per-depth")  # decay 0.99
    for step in range(120):
        one_depth.update(3, 3, 0.1, 0.2)
        assert one_depth.fitted_cost() is None, step
    assert one_depth.depth(0) == 4  # every draft accepted, the configured costs: the deepest
    verified = AdaptiveDepth(3, decay=1.0, learn_costs=True, cost_model="per-depth")
    verified.update(2, 0, 0.25, 0.5)
    verified.update(1, 0, 0.125, 2.0)
    assert verified.measured_costs() == [2.125, 0.75, None]


def test_steps_measured_at_zero_seconds_fit_no_line():
    """Steps of two depths, every one timed at 0 s (a clock too coarse for them): the line through them,
    ``cost(k) = 0``, would make every rate a division by zero, so there is no fitted line and the
    configured costs stand (mutation round 6: ``intercept + slope >= 0`` survived); each depth's measured
    mean is 0.0 s, not "never drafted"."""
    policy = AdaptiveDepth(3, decay=1.0, learn_costs=True, cost_model="per-depth")
    policy.update(1, 1, 0.0, 0.0)
    policy.update(2, 2, 0.0, 0.0)
    assert policy.fitted_cost() is None and policy.cost(2) == pytest.approx(1.1)
    assert policy.measured_costs() == [0.0, 0.0, None]
    # alphas 0.75, 5 / 6, 5 / 6 over costs 1.05, 1.1, 1.15: rates 1.67, 2.16, 2.52
    assert policy.depth(0) == 3


def test_per_depth_costs_weigh_each_depth_against_the_line():
    """Steps not linear in the depth (1.0, 1.1 and 2.6 s at depths 1, 3, 7; every draft accepted):
    the line through them prefers depth 7; each depth's own mean, weighed against the line one step
    to ``n_k``, depth 3. A depth not drafted lately drifts back to the line's price."""
    line = AdaptiveDepth(7, decay=1.0, learn_costs=True, prior=(50, 1))
    table = AdaptiveDepth(7, decay=1.0, learn_costs=True, prior=(50, 1), cost_model="per-depth")
    for policy in (line, table):
        for k, seconds in ((1, 1.0), (3, 1.1), (7, 2.6)):
            policy.update(k, k, seconds, 0.0)
    # least squares through (1, 1.0), (3, 1.1), (7, 2.6): slope 79 / 280, intercept 149 / 280
    assert line.fitted_cost() == table.fitted_cost() == pytest.approx((149 / 280, 79 / 280))
    assert table.measured_costs() == pytest.approx([1.0, None, 1.1, None, None, None, 2.6])
    assert LINE_WEIGHT == 1.0
    assert table.cost(3) == pytest.approx((1.1 + (149 + 3 * 79) / 280) / 2)  # one step of its own, the line
    assert table.cost(5) == pytest.approx((149 + 5 * 79) / 280)  # never drafted: the line
    assert line.cost(3) == pytest.approx((149 + 3 * 79) / 280)
    assert line.depth(0) == 7 and table.depth(0) == 3
    table.update(3, 3, 1.3, 0.0)  # a second depth-3 step: the mean of the two, weighed 2 : 1
    fit = table.fitted_cost()
    assert table.measured_costs()[2] == pytest.approx(1.2)
    assert table.cost(3) == pytest.approx((2 * 1.2 + fit[0] + 3 * fit[1]) / 3)
    decaying = AdaptiveDepth(3, decay=0.5, learn_costs=True, cost_model="per-depth")
    decaying.update(2, 0, 1.0, 0.0)
    decaying.update(2, 0, 3.0, 0.0)  # weights 0.5 and 1: (0.5 + 3) / 1.5
    assert decaying.measured_costs() == pytest.approx([None, 3.5 / 1.5, None])
    assert decaying.describe()["cost_model"] == "per-depth"
    drifting = AdaptiveDepth(7, decay=0.9, learn_costs=True, prior=(50, 1), cost_model="per-depth")
    drifting.update(1, 1, 1.0, 0.0)
    drifting.update(3, 3, 3.0, 0.0)  # one slow depth-3 step
    drifting.update(7, 7, 2.6, 0.0)
    assert drifting.depth(0) != 3
    for i in range(60):  # steps at depths 1 and 7 only
        k = 1 if i % 2 else 7
        drifting.update(k, k, 1.0 if k == 1 else 2.6, 0.0)
    fit = drifting.fitted_cost()
    assert drifting.cost(3) == pytest.approx(fit[0] + 3 * fit[1], rel=0.01)  # back at the line's price


@pytest.mark.parametrize("j", [0, 2, 5, 8])
def test_adaptive_depth_settles_on_what_an_oracle_deserves(models, j):
    """A draft right for exactly j tokens a step: once the counts have built up (the last third of
    the steps), most steps draft max(j, 1), the rest one more (always rejected: the policy tries it
    again as that count fades)."""
    target, head = models
    prompt = random_prompt(8)
    ref = wmtp.greedy_generate(target, prompt, 150)
    seq = torch.cat([prompt, ref, torch.zeros(10, dtype=torch.long)])
    policy = AdaptiveDepth(8)
    seen = []
    update = policy.update
    policy.update = lambda d, a, ds, vs: seen.append(d) or update(d, a, ds, vs)
    out, stats = wmtp.speculative_generate(target, grading.OracleDraft(head, seq, j, V), prompt, 150, policy)
    assert torch.equal(out, ref) and len(seen) == stats.steps
    late, deserved = seen[-(len(seen) // 3):], max(j, 1)  # the last third of the steps
    assert set(late) <= {deserved, deserved + 1} and late.count(deserved) >= 0.6 * len(late), seen


class Growing(Cycling):
    """Claims a max_depth of 2, raises it to 4 after two steps, then drafts 4: past what the loop sized for."""

    def __init__(self):
        super().__init__([2, 2, 4])
        self.max_depth = 2

    def update(self, depth, accepted, draft_s, verify_s):
        super().update(depth, accepted, draft_s, verify_s)
        self.max_depth = 4 if len(self.seen) >= 2 else 2


@pytest.mark.parametrize("make, match", [
    (lambda: 0, "depth must be a positive integer"), (lambda: "3", "depth policy"), (lambda: True, "depth policy"),
    (lambda: Cycling([0]), "depth must be a positive integer"), (lambda: Cycling([2, 9]), "must draft an int in"),
    (lambda: Cycling([2, 2.0]), "must draft an int in"), (lambda: Cycling([2, True]), "must draft an int in"),
    (lambda: Growing(), "must draft an int in \\[1, 2\\]"),
    # mutation round 6: the bounds of next_depth themselves (a depth of 0, and max_depth + 1, let through survived)
    (lambda: Cycling([2, 0]), "must draft an int in"), (lambda: Cycling([2, 4]), "must draft an int in \\[1, 3\\]"),
])
@pytest.mark.parametrize("generate", [wmtp.speculative_generate, wmtp.static_speculative_generate])
def test_bad_depths_raise_value_error(models, make, match, generate):
    target, head = models
    depth = make()
    if isinstance(depth, Cycling) and depth.max_depth > 2:
        depth.max_depth = 3  # claims 3, drafts 9 on its second step
    with pytest.raises(ValueError, match=match):
        generate(target, head, random_prompt(5), 12, depth)


@pytest.mark.parametrize("kwargs", [{"draft_cost": -1}, {"draft_cost": float("inf")}, {"prior": (0, 1)},
                                    {"prior": (1,)}, {"prior": (True, 1)}, {"decay": 0}, {"decay": 1.5},
                                    {"decay": True}, {"verify_cost_per_draft": True}, {"learn_costs": 1},
                                    {"cost_model": "table", "learn_costs": True}, {"cost_model": "per-depth"},
                                    {"max_depth": 0}, {"prior": 5}, {"prior": None}])  # the last two: TypeErrors
def test_bad_adaptive_settings_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        AdaptiveDepth(**({"max_depth": 4} | kwargs))


@pytest.mark.parametrize("depth, accepted", [(0, 0), (5, 1), (2, 3), (2, -1)])
def test_update_refuses_an_impossible_step(depth, accepted):
    with pytest.raises(ValueError, match="a step drafts"):
        AdaptiveDepth(4).update(depth, accepted, 0.0, 0.0)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_cuda_policies_are_lossless(models, impl):
    import copy

    target, head = (m.to("cuda") for m in copy.deepcopy(models))
    prompt = random_prompt(12, seed=4).cuda()
    ref = wmtp.greedy_generate(target, prompt, 30, impl=impl)
    for n_sink, window in KEYSETS:
        for policy in (Cycling([3, 1, 6]), AdaptiveDepth(6, learn_costs=True)):
            out, _ = wmtp.speculative_generate(target, head, prompt, 30, policy, n_sink, window, impl=impl)
            assert torch.equal(out, ref)


@pytest.mark.parametrize("alphas,costs,k", [
    ([0.5, 0.5], [1.0, 1.0], 2),  # 1.5 vs 1.75 tokens at one cost: the deeper draft
    ([0.5, 0.5], [1.0, 2.0], 1),  # 1.5 vs 0.875 tokens a unit of cost
    ([1.0, 0.0, 0.0], [1.0, 1.0, 1.0], 1),  # 2 tokens at every depth: a tie goes to the smallest k
    ([0.0, 1.0, 1.0], [2.0, 1.0, 1.0], 2),  # 0.5 vs 1 vs 1: the tie between 2 and 3 goes to 2
])
def test_best_depth_literal(alphas, costs, k):
    assert best_depth(alphas, costs) == k


def test_an_adaptive_prior_is_any_pair():
    import numpy as np

    for prior in ((2, 3), [2, 3], np.array([2.0, 3.0]), np.array([2, 3])):  # an int array was refused
        assert AdaptiveDepth(3, prior=prior).prior == (2.0, 3.0)
    assert AdaptiveDepth(3, prior=iter((2, np.float32(3)))).prior == (2.0, 3.0)  # read once, as the pair checked


def test_adaptive_numbers_may_be_numpy_scalars_and_refusals_name_the_argument():
    """np.float32 costs and decay were refused (decay with a range message); AdaptiveDepth(0) named ``depth``."""
    import numpy as np

    policy = AdaptiveDepth(3, draft_cost=np.float32(0.25), verify_cost_per_draft=np.int64(0), decay=np.float32(0.5))
    assert (policy.draft_cost, policy.verify_cost_per_draft, policy.decay) == (0.25, 0.0, 0.5)
    assert all(type(x) is float for x in (policy.draft_cost, policy.verify_cost_per_draft, policy.decay))
    for kwargs, match in [({"max_depth": 0}, "^max_depth must be an integer >= 1, got 0$"),
                          ({"decay": "0.5"}, "^decay must be a number in \\(0, 1\\], got '0.5'$"),
                          ({"decay": np.float32(1.5)}, "^decay must be a number in"),
                          ({"draft_cost": np.bool_(True)}, "^draft_cost must be a finite number >= 0"),
                          ({"draft_cost": np.float32("nan")}, "^draft_cost must be a finite number >= 0")]:
        with pytest.raises(ValueError, match=match):
            AdaptiveDepth(**({"max_depth": 3} | kwargs))
