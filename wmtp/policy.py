"""Draft-depth policies: how many tokens a speculative step drafts (beyond arXiv 2607.21535, which
drafts a fixed depth, Sec. 4; its step-cost model, Sec. 2, is what a policy trades against).

A step that drafts ``k`` tokens commits ``1 + a`` of them (``a`` accepted drafts plus the
target's own token) and costs about ``cost(k) = 1 + (draft_cost + verify_cost_per_draft) * k``
verify passes. With ``alpha_i`` the chance that draft ``i`` is accepted once drafts ``1 .. i-1``
were, the expected tokens of a step are

    E[1 + a | k] = 1 + sum_{i=1..k} prod_{j=1..i} alpha_j,

and ``AdaptiveDepth`` drafts the ``k`` that maximises ``E[1 + a | k] / cost(k)``, the expected
tokens per unit of time, re-estimating each ``alpha_i`` from the steps so far: decaying counts of
the steps that verified draft ``i``, with the estimate of draft ``i - 1`` as their prior, so a
position the policy has not drafted lately is believed as good as the one before it (and gets
drafted again, to check). With ``learn_costs`` the cost is a line fitted to the measured step
times, ``cost(k) = A + B k`` seconds, or (``cost_model="per-depth"``) each depth's own mean step
time, weighed against the line by how many (decayed) steps measured it: a GPU's steps need not be
linear in the depth (docs/results/depth-gpu.md: an 8-row verify pass costs twice a 4-row one
there), and a depth not drafted lately drifts back to the line's price, so one slow step cannot
keep it from being tried again. A draft whose late guesses are rarely right, or that is expensive
(the native draft at long context pays the draft-KV tax on every token), is asked for fewer tokens.

The depth only decides how many drafts a step proposes; the verification that commits tokens is
the same, so under greedy verification (and the gumbel method of wmtp/sampling.py) every
policy's output equals dense decoding (tests/test_policy.py asserts ``torch.equal``); under
rejection sampling it has the dense distribution, its tokens depending on the depths drafted.
A policy keeps what it learned across the runs it is passed to; pass a fresh one for an
independent run.

Context gating (beyond the paper too, whose windowed draft reads its window at every context): a
step may draft with the full causal set while its context is short, where the draft-KV tax is small
and a small window can cost acceptance, and with the sink+window set once the context passes
``gate`` tokens. ``gated_key_set`` is that choice, made once per step from the step's context, as
``depth`` is made once per step from its position; it picks one of wmtp/keyset.py's two key sets
and defines no third. Which gate pays (if any) is the draft head's: docs/results/gate.md.
"""

from __future__ import annotations

import math
from typing import Protocol

from .checks import as_real, check_int, check_number
from .keyset import check_key_set_args

__all__ = ["DepthPolicy", "FixedDepth", "AdaptiveDepth", "as_policy", "best_depth", "check_gate", "expected_tokens",
           "gated_key_set", "next_depth"]

COST_MODELS = ("line", "per-depth")  # AdaptiveDepth's learned step costs
LINE_WEIGHT = 1.0  # "per-depth": the fitted line counts as this many steps of a depth's own


def expected_tokens(alphas: list[float], k: int) -> float:
    """``E[1 + a | k] = 1 + sum_{i=1..k} prod_{j=1..i} alpha_j``: the tokens a step that drafts ``k``
    commits on average, ``alphas[i - 1]`` the chance that draft ``i`` is accepted once drafts
    ``1 .. i-1`` were."""
    total, run = 1.0, 1.0
    for alpha in alphas[:k]:
        run *= alpha
        total += run
    return total


def best_depth(alphas: list[float], costs: list[float]) -> int:
    """The ``k`` in ``1 .. len(costs)`` with the most expected tokens per unit of cost,
    ``expected_tokens(alphas, k) / costs[k - 1]`` (the smallest such ``k`` on a tie)."""
    rates = [expected_tokens(alphas, k) / costs[k - 1] for k in range(1, len(costs) + 1)]
    return 1 + rates.index(max(rates))


class DepthPolicy(Protocol):
    """What the speculative loop asks of a policy: ``max_depth``, then per step ``depth(position)``
    (an int in ``[1, max_depth]``) before drafting and ``update(depth, accepted, draft_s, verify_s)``
    after verifying."""

    max_depth: int

    def depth(self, position: int) -> int: ...

    def update(self, depth: int, accepted: int, draft_s: float, verify_s: float) -> None: ...


class FixedDepth:
    """Draft ``depth`` tokens every step (the paper's setting).

    Args:
        depth: the drafts of every step, a positive integer (``max_depth``).

    Raises:
        ValueError: for a ``depth`` that is not a positive integer.
    """

    def __init__(self, depth: int) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        self.max_depth = depth

    def depth(self, position: int) -> int:
        """Drafts for the step whose latest committed token sits at ``position``."""
        return self.max_depth

    def update(self, depth: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """Hear how a step went (a fixed depth learns nothing)."""

    def describe(self) -> dict:
        return {"policy": "fixed", "max_depth": self.max_depth}


class AdaptiveDepth:
    """Draft the depth that maximises expected tokens per unit of step cost (module docstring).

    Args:
        max_depth: the most drafts a step may propose (the caches are sized for it).
        draft_cost: one drafted token's time, in verify passes (``learn_costs`` re-estimates it).
        verify_cost_per_draft: what one more drafted token adds to the verify pass, in verify passes.
        prior: Beta prior ``(accepts, rejects)`` of ``alpha_1``; each later ``alpha_i`` has the
            estimate of ``alpha_{i-1}`` as its prior mean, with the same weight ``sum(prior)``.
        decay: the weight a step's counts keep per later step (``1``: never forget).
        learn_costs: fit ``cost(k) = A + B k`` (least squares, weighted by ``decay``) to the
            measured seconds of the steps (draft and verify phases), once steps of two depths have
            been seen; until then, and without it, the cost is ``draft_cost`` and
            ``verify_cost_per_draft``'s. The depths, though never the output, then depend on timing.
        cost_model: with ``learn_costs``, ``"line"`` (the fitted line for every depth) or
            ``"per-depth"`` (each depth's decayed mean step seconds and the line, weighted
            ``n_k : LINE_WEIGHT``, ``n_k`` the depth's decayed count of steps).

    The costs, ``prior`` and ``decay`` may be ints, floats or NumPy scalars (``as_real``; not bools);
    ``max_depth`` is a Python int.

    Raises:
        ValueError: for a ``max_depth`` that is not a positive integer, negative or non-finite
            costs, a ``prior`` that is not two finite numbers > 0, a ``decay`` outside ``(0, 1]``,
            a non-bool ``learn_costs``, or an unknown ``cost_model`` (or ``"per-depth"`` without
            ``learn_costs``).
    """

    def __init__(self, max_depth: int, draft_cost: float = 0.05, verify_cost_per_draft: float = 0.0,
                 prior: tuple[float, float] = (1.0, 1.0), decay: float = 0.99, learn_costs: bool = False,
                 cost_model: str = "line") -> None:
        check_int("max_depth", max_depth, 1)
        draft_cost, verify_cost_per_draft, decay = as_real(draft_cost), as_real(verify_cost_per_draft), as_real(decay)
        for name, value in (("draft_cost", draft_cost), ("verify_cost_per_draft", verify_cost_per_draft)):
            check_number(name, value, positive=False)
        try:
            pair = tuple(as_real(p) for p in prior)  # any pair: a tuple, a list, a NumPy array (of ints too)
        except TypeError:
            pair = ()
        if len(pair) != 2 or not all(not isinstance(p, bool) and isinstance(p, (int, float)) and p > 0
                                     and math.isfinite(p) for p in pair):
            raise ValueError(f"prior must be two finite numbers > 0 (accepts, rejects), got {prior!r}")
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay <= 1:
            raise ValueError(f"decay must be a number in (0, 1], got {decay!r}")
        if not isinstance(learn_costs, bool):
            raise ValueError(f"learn_costs must be True or False, got {learn_costs!r}")
        if cost_model not in COST_MODELS:
            raise ValueError(f"cost_model must be one of {', '.join(COST_MODELS)}, got {cost_model!r}")
        if cost_model != "line" and not learn_costs:
            raise ValueError(f"cost_model={cost_model!r} measures the steps: it needs learn_costs=True")
        self.max_depth, self.draft_cost, self.verify_cost_per_draft = max_depth, float(draft_cost), \
            float(verify_cost_per_draft)
        self.prior, self.decay, self.learn_costs = (float(pair[0]), float(pair[1])), float(decay), learn_costs
        self.cost_model = cost_model
        self.accepts = [0.0] * max_depth  # decayed count of steps whose draft i was accepted
        self.tried = [0.0] * max_depth  # decayed count of steps that verified draft i
        self.time_sums = [0.0] * 5  # decayed sums over steps of 1, k, k^2, seconds, k * seconds
        self.depth_steps = [0.0] * max_depth  # decayed count of the steps at each depth
        self.depth_seconds = [0.0] * max_depth  # decayed sum of their seconds

    def acceptance(self) -> list[float]:
        """``alpha_i`` for draft positions ``1 .. max_depth``: ``(w m + accepts_i) / (w + tried_i)``
        with ``w = sum(prior)`` and ``m`` the prior's mean for ``i = 1``, ``alpha_{i-1}`` after."""
        a, b = self.prior
        mean, out = a / (a + b), []
        for acc, tried in zip(self.accepts, self.tried):
            mean = ((a + b) * mean + acc) / (a + b + tried)
            out.append(mean)
        return out

    def expected_tokens(self, k: int) -> float:
        """``E[1 + a | k]``: tokens a step that drafts ``k`` commits, on average."""
        return expected_tokens(self.acceptance(), k)

    def fitted_cost(self) -> tuple[float, float] | None:
        """``(A, B)`` of the line ``A + B k`` fitted to the measured step seconds (``B`` at least 0),
        or ``None``: without ``learn_costs``, before steps of two depths, or where the fitted line
        gives a depth-1 step no positive cost (``A + B <= 0``)."""
        n, sk, skk, st, skt = self.time_sums
        spread = n * skk - sk * sk
        if not self.learn_costs or n <= 0 or spread <= 1e-9 * n * n:
            return None
        slope = max((n * skt - sk * st) / spread, 0.0)
        intercept = (st - slope * sk) / n
        return (intercept, slope) if intercept + slope > 0 else None

    def measured_costs(self) -> list[float | None]:
        """Each depth's decayed mean step seconds, ``None`` where no step drafted it."""
        return [s / n if n > 0 else None for n, s in zip(self.depth_steps, self.depth_seconds)]

    def cost(self, k: int) -> float:
        """A ``k``-draft step's cost: once the line is fitted, its seconds (``"per-depth"``:
        ``(n_k mean_k + LINE_WEIGHT line(k)) / (n_k + LINE_WEIGHT)``), else ``1 + (draft_cost +
        verify_cost_per_draft) k`` verify passes (only ratios between depths matter)."""
        fit = self.fitted_cost()
        if fit is None:
            return 1.0 + (self.draft_cost + self.verify_cost_per_draft) * k
        line = fit[0] + fit[1] * k
        if self.cost_model == "line":
            return line
        n, seconds = self.depth_steps[k - 1], self.depth_seconds[k - 1]
        return (seconds + LINE_WEIGHT * line) / (n + LINE_WEIGHT)

    def depth(self, position: int) -> int:
        """``best_depth`` of the estimated acceptances and costs."""
        return best_depth(self.acceptance(), [self.cost(k) for k in range(1, self.max_depth + 1)])

    def update(self, depth: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """Count a step that drafted ``depth`` and accepted ``accepted``: drafts ``1 .. accepted``
        were accepted, draft ``accepted + 1`` (if any) rejected, the later ones never verified."""
        if not (1 <= depth <= self.max_depth and 0 <= accepted <= depth):
            raise ValueError(f"a step drafts 1..{self.max_depth} and accepts at most its depth; got depth {depth}, "
                             f"accepted {accepted}")
        self.accepts = [c * self.decay for c in self.accepts]
        self.tried = [c * self.decay for c in self.tried]
        for i in range(min(accepted + 1, depth)):
            self.tried[i] += 1.0
            self.accepts[i] += float(i < accepted)
        seconds = draft_s + verify_s
        self.time_sums = [c * self.decay + x for c, x in zip(self.time_sums, (1.0, depth, depth * depth, seconds,
                                                                               depth * seconds))]
        self.depth_steps = [c * self.decay + (i == depth - 1) for i, c in enumerate(self.depth_steps)]
        self.depth_seconds = [c * self.decay + seconds * (i == depth - 1) for i, c in enumerate(self.depth_seconds)]

    def describe(self) -> dict:
        return {"policy": "adaptive", "max_depth": self.max_depth, "draft_cost": self.draft_cost,
                "verify_cost_per_draft": self.verify_cost_per_draft, "prior": list(self.prior),
                "decay": self.decay, "learn_costs": self.learn_costs, "cost_model": self.cost_model,
                "fitted_cost": self.fitted_cost(), "measured_costs": self.measured_costs()}


def as_policy(depth) -> FixedDepth | AdaptiveDepth:
    """A generator's ``depth`` argument as a policy: an int is ``FixedDepth``; a policy is itself
    (anything with ``max_depth``, ``depth(position)`` and ``update(...)``)."""
    if isinstance(depth, int) and not isinstance(depth, bool):
        return FixedDepth(depth)
    if not all(hasattr(depth, name) for name in ("max_depth", "depth", "update")):
        raise ValueError(f"depth must be a positive integer or a depth policy (wmtp.policy), got {depth!r}")
    FixedDepth(depth.max_depth)  # the same check of max_depth
    return depth


def next_depth(policy: DepthPolicy, position: int, max_depth: int) -> int:
    """``policy.depth(position)``, checked: an int in ``[1, max_depth]``, the ``max_depth`` the
    policy had when the loop sized its caches (and, in the CUDA-graph loop, its state) for it.

    Raises:
        ValueError: for anything else.
    """
    k = policy.depth(position)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= max_depth:
        raise ValueError(f"the depth policy must draft an int in [1, {max_depth}] a step, got {k!r}")
    return k


def check_gate(gate: int | None, window: int | None) -> None:
    """Validate a context gate: ``None``, or a positive integer gating a windowed key set.

    Raises:
        ValueError: if ``gate`` is not a positive integer, or gates the full causal set
            (``window=None`` has no window to switch on).
    """
    if gate is None:
        return
    if isinstance(gate, bool) or not isinstance(gate, int) or gate < 1:
        raise ValueError(f"gate must be a positive integer (a context length) or None, got {gate!r}")
    if window is None:
        raise ValueError(f"gate={gate} switches a window on past that context; the native key set (window=None) "
                         "has no window")


def gated_key_set(context: int, n_sink: int | None, window: int | None,
                  gate: int | None) -> tuple[int | None, int | None]:
    """The ``(n_sink, window)`` a speculative step drafts with under a context gate.

    ``context`` is the number of tokens committed before the step drafts (positions ``0 ..
    context-1``, the target's latest token included). The step reads the full causal set
    ``(None, None)`` while ``context <= gate``, and ``(n_sink, window)`` once ``context > gate``;
    ``gate=None`` is no gate: always ``(n_sink, window)``. Example: with ``n_sink=8, window=64,
    gate=4096`` a step at context 4096 drafts natively, one at 4097 over 8 sinks + 64 recent keys.
    Every query of a step reads the step's key set (the choice never splits a step).

    Args:
        context: the step's context, ``n + 1`` for the target's latest token at position ``n``.
        n_sink, window: the gated key set (wmtp/keyset.py); ``window`` not ``None`` with a gate.
        gate: the longest context drafted with the full causal set, or ``None``.

    Returns:
        ``(None, None)`` (the full causal set) or ``(n_sink, window)``.

    Raises:
        ValueError: for a bad key set or gate (``check_gate``), or a context below 1.
    """
    check_key_set_args(n_sink, window)
    check_gate(gate, window)
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"a step's context must be a positive integer, got {context!r}")
    if gate is not None and context <= gate:
        return None, None
    return n_sink, window
