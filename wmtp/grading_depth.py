"""Assignment 08's checks (``wmtp grade depth``): ``best_depth``, the draft depth that maximises
expected tokens per unit of step cost (the step-cost model of arXiv 2607.21535, Sec. 2, turned into
a choice of depth; the paper drafts a fixed depth, Sec. 4: wmtp/policy.py).

Checked in order (wmtp/grading.py runs them and stops at the first failure): literal depths for
each regime, ``wmtp.policy.best_depth`` on fuzzed acceptances and costs, and then what the depth is
for: simulated steps (each draft accepted with its ``alpha`` until the first rejection) at every
depth, where the student's depth must deliver as many tokens per unit of cost as the best one,
within five standard errors.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterator

from .grading_checks import as_int
from .policy import best_depth, expected_tokens

__all__ = ["DEPTH_LITERAL", "depth_checks"]

DEPTH_LITERAL = [  # (alphas, costs) -> depth; the rates E[AL | k] / cost(k) worked by hand in the comment
    (([0.9, 0.9, 0.9], [1.0, 1.0, 1.0]), 3),  # free drafts, as deep as allowed: 1.9, 2.71, 3.439
    (([0.5, 0.5, 0.5], [1.0, 2.0, 3.0]), 1),  # cost k: 1.5, 0.875, 0.625
    (([0.5, 0.5], [1.0, 1.4]), 1),  # 1.5, 1.25 (without the target's token: 0.5, 0.536)
    (([0.8, 0.8, 0.8, 0.8], [1.1, 1.2, 1.3, 1.4]), 4),  # 1.636, 2.033, 2.271, 2.401
    (([0.8, 0.5, 0.1], [1.0, 1.1, 1.2]), 2),  # E = 1.8, 2.2, 2.24: rates 1.8, 2.0, 1.867
    (([0.0, 0.9], [1.0, 1.1]), 1),  # draft 2 never counts when draft 1 is always rejected: 1.0, 0.909
    (([1.0, 1.0], [1.0, 1.5]), 1),  # a tie, 2 / 1 = 3 / 1.5: the smallest depth
    (([0.6], [0.8]), 1),  # one depth to choose from
    (([0.9, 0.9, 0.9, 0.9], [1.0, 1.3]), 2),  # more alphas than depths: k runs over costs, 1.9, 2.085
]
TRIALS = 20000  # simulated steps at each depth


def _hint(fn_out: int, expected: int, alphas: list[float], costs: list[float]) -> str:
    K = len(costs)
    rates = [expected_tokens(alphas, k) / costs[k - 1] for k in range(1, K + 1)]
    if 1 <= fn_out <= K and rates[fn_out - 1] == max(rates):
        return " (a tie: return the smallest such depth)"
    no_target = [sum(math.prod(alphas[:i]) for i in range(1, k + 1)) / costs[k - 1] for k in range(1, K + 1)]
    if fn_out == 1 + no_target.index(max(no_target)):
        return " (a step also commits the target's own token: E[AL | k] = 1 + alpha_1 + alpha_1 alpha_2 + ...)"
    no_product = [(1 + sum(alphas[:k])) / costs[k - 1] for k in range(1, K + 1)]
    if fn_out == 1 + no_product.index(max(no_product)):
        return " (draft i counts only if drafts 1 .. i-1 were accepted: multiply the alphas, do not add them)"
    if fn_out == expected - 1:
        return " (if you return an index: depths count from 1, return k, not k - 1)"
    return ""


def _depth_case(fn, alphas: list[float], costs: list[float], expected: int) -> str | None:
    try:
        answer = fn(list(alphas), list(costs))
    except IndexError as e:
        if len(alphas) <= len(costs):
            raise
        return (f"raised IndexError: {e} ({len(alphas)} alphas but {len(costs)} costs: the depths are "
                f"k = 1 .. len(costs), and the alphas past them are not used)")
    got = as_int(answer)  # an int, numpy's included
    if got is None:
        return f"expected the int {expected}, got {answer!r}"
    if got == expected:
        return None
    return f"expected {expected}, got {got}" + _hint(got, expected, alphas, costs)


def _simulated_rate(alphas: list[float], k: int, cost: float, rng: random.Random) -> tuple[float, float]:
    """Mean and standard error of tokens per unit of cost over ``TRIALS`` simulated steps."""
    tokens = []
    for _ in range(TRIALS):
        a = 0
        while a < k and rng.random() < alphas[a]:
            a += 1
        tokens.append((a + 1) / cost)
    mean = sum(tokens) / TRIALS
    var = sum((t - mean) ** 2 for t in tokens) / (TRIALS - 1)
    return mean, math.sqrt(var / TRIALS)


def _simulation_case(fn, alphas: list[float], costs: list[float], seed: int) -> str | None:
    answer = fn(list(alphas), list(costs))
    k = as_int(answer)
    if k is None or not 1 <= k <= len(costs):
        return f"expected a depth in 1 .. {len(costs)}, got {answer!r}"
    rng = random.Random(seed)
    rates = [_simulated_rate(alphas, d, costs[d - 1], rng) for d in range(1, len(costs) + 1)]
    best = max(range(len(rates)), key=lambda i: rates[i][0])
    (mine, se_mine), (top, se_top) = rates[k - 1], rates[best]
    if mine >= top - 5 * math.hypot(se_mine, se_top):
        return None
    return (f"in {TRIALS} simulated steps at each depth, depth {k} delivered {mine:.4f} tokens per unit of cost and "
            f"depth {best + 1} {top:.4f} (standard errors {se_mine:.4f}, {se_top:.4f})")


def depth_checks(fn: Callable | None, n_fuzz: int) -> Iterator[tuple[str, Callable[[], str | None]]]:
    """The checks of ``best_depth`` (the student's function ``fn``), named, in order."""
    rng = random.Random(8)
    fuzz = []
    for _ in range(n_fuzz):
        K = rng.randrange(1, 9)
        alphas = [round(rng.random(), 3) for _ in range(K)]
        base, per_draft = rng.uniform(0.5, 2.0), rng.choice([0.0, rng.uniform(0.0, 0.6)])
        costs = [round(base + per_draft * k + rng.uniform(0.0, 0.3) * (k > 4), 3) for k in range(1, K + 1)]
        fuzz.append((alphas, costs))
    for (alphas, costs), expected in DEPTH_LITERAL + [(a, best_depth(*a)) for a in fuzz]:
        yield (f"best_depth(alphas={alphas}, costs={costs})",
               functools.partial(_depth_case, fn, alphas, costs, expected))
    cases = [([0.9] * 7, [1.0 + 0.05 * k for k in range(1, 8)]), ([0.6] * 7, [1.0 + 0.3 * k for k in range(1, 8)]),
             ([0.95, 0.9, 0.8, 0.6, 0.4, 0.2, 0.1], [1.0, 1.05, 1.1, 1.6, 1.7, 1.8, 1.9]),
             ([0.99] * 7, [1.0, 1.1, 1.2, 1.3, 2.6, 2.7, 2.8])]
    for i, (alphas, costs) in enumerate(cases):
        yield (f"simulated steps with alphas={alphas} and costs={costs}: your depth against every depth",
               functools.partial(_simulation_case, fn, alphas, costs, i))
