"""Assignment 06's checks (``wmtp grade rejection``): ``verify_one``, speculative sampling's rule for
one drafted token (Leviathan et al. 2023, Chen et al. 2023; wmtp/sampling.py ``verify_rejection``
applies it token by token; arXiv 2607.21535's window changes only ``q``, Sec. 3).

The rule: accept the draft ``d`` (sampled from the draft's ``q``) when ``u * q[d] < p[d]``, with
``u`` uniform in ``[0, 1)``: probability ``min(1, p[d] / q[d])``. Otherwise commit a sample of the
residual ``max(p - q, 0)`` (normalised), drawn from a second uniform ``r`` by inverse CDF. Then
the committed token is distributed as ``p`` whatever ``q`` is: that is the property graded.

Checked in order (wmtp/grading.py stops at the first failure): one case called 20 times that must
give one token (a function that draws random numbers of its own instead of using ``u`` and ``r``
may have the right distribution, but not a reproducible answer); hand-computed literal cases (their
uniforms chosen away from every boundary, so any inverse-CDF convention gives the same token, but
for one ``r = 0``, where the token must be the first with residual mass); then for eight pairs
``(p, q)`` 20000 seeded trials, each a draft from ``q`` and two uniforms: the committed tokens'
frequencies must match ``p`` and the acceptance ``sum min(p, q)``, each within five standard
errors: a right rule fails any of these 34 comparisons with probability about 2e-5, and the trials
are seeded, so a file gets the same verdict every time it is graded.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterator

from .grading_checks import as_int

__all__ = ["REJECTION_LITERAL", "rejection_checks"]

REJECTION_LITERAL = [  # (p, q, draft, u, r) -> the committed token
    (([0.5, 0.5], [0.5, 0.5], 0, 0.99, 0.5), 0),  # p = q: always accepted
    (([0.1, 0.3, 0.6], [0.6, 0.3, 0.1], 2, 0.999, 0.5), 2),  # p(d) > q(d): always accepted
    (([0.2, 0.8], [0.6, 0.4], 0, 0.3, 0.5), 0),  # 0.3 * 0.6 = 0.18 < 0.2: accepted
    (([0.2, 0.8], [0.6, 0.4], 0, 0.5, 0.5), 1),  # 0.30 >= 0.2: rejected; the residual is all on token 1
    (([0.1, 0.3, 0.6], [0.5, 0.25, 0.25], 0, 0.9, 0.1), 1),  # rejected; residual [0, .05, .35]: r * 0.4 = 0.04
    (([0.1, 0.3, 0.6], [0.5, 0.25, 0.25], 0, 0.9, 0.3), 2),  # ... r * 0.4 = 0.12, past token 1's 0.05 (p: 1)
    (([0.0, 1.0], [1.0, 0.0], 0, 0.0, 0.7), 1),  # p(d) = 0: never accepted (0 * 1 < 0 is false)
    (([0.0, 0.6, 0.4], [0.3, 0.2, 0.5], 2, 0.9, 0.0), 1),  # 0.45 >= 0.4: rejected; r = 0: residual [0, .4, 0]
]
REPEATED = (([0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], 0, 0.5, 0.5), 20)  # rejected; residual on 1, 2, 3
PAIRS = [  # (p, q): the draft right, flattened, sharpened, disjoint, one-hot, and of a wider support
    ([0.5, 0.3, 0.2], [0.5, 0.3, 0.2]), ([0.7, 0.2, 0.1], [1 / 3, 1 / 3, 1 / 3]),
    ([0.4, 0.4, 0.2], [0.9, 0.05, 0.05]), ([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]),
    ([0.0, 1.0, 0.0], [0.2, 0.3, 0.5]), ([0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]),
    ([0.05, 0.05, 0.9], [0.6, 0.3, 0.1]), ([0.3, 0.0, 0.7], [0.3, 0.4, 0.3]),
]
TRIALS, SIGMAS = 20000, 5.0


def _literal_case(fn, p, q, d, u, r, expected) -> str | None:
    answer = fn(p, q, d, u, r)
    got = as_int(answer)
    if got is None:
        return f"expected the int token {expected}, got {answer!r}"
    if got == expected:
        return None
    hint = ""
    if expected == d:
        hint = " (accept when u * q[draft] < p[draft]: with probability min(1, p/q))"
    elif got == d:
        hint = " (rejected here: u * q[draft] >= p[draft]; a rejected draft is never committed)"
    elif 0 <= got < len(p) and p[got] <= q[got]:
        hint = (f" (token {got} has no residual mass max(p - q, 0): commit the first token whose cumulative residual "
                "mass EXCEEDS r times the total)")
    else:
        hint = " (after a rejection, sample max(p - q, 0), normalised, not p)"
    return f"expected {expected}, got {got}{hint}"


def _repeated_case(fn, p, q, d, u, r, calls: int) -> str | None:
    """The same arguments ``calls`` times must give one answer: ``u`` and ``r`` are the only randomness."""
    got = {repr(fn(list(p), list(q), d, u, r)) for _ in range(calls)}
    if len(got) > 1:
        return (f"returned {', '.join(sorted(got))} for the same arguments over {calls} calls: the token must "
                "depend on u and r alone (test with u, sample the residual with r; no random numbers of your own)")
    return None


def _distribution_case(fn, p, q, seed: int) -> str | None:
    """``TRIALS`` drafts from ``q`` with two uniforms each: the committed tokens must follow ``p``."""
    rng = random.Random(seed)
    counts, accepted = [0] * len(p), 0
    for _ in range(TRIALS):
        d = rng.choices(range(len(q)), weights=q)[0]
        answer = fn(p, q, d, rng.random(), rng.random())
        token = as_int(answer)
        if token is None or not 0 <= token < len(p):
            return f"returned {answer!r} for draft {d}: not a token of the vocabulary 0..{len(p) - 1}"
        counts[token] += 1
        accepted += token == d
    for x, (c, px) in enumerate(zip(counts, p)):
        se = math.sqrt(max(px * (1 - px), 1 / TRIALS) / TRIALS)
        if abs(c / TRIALS - px) > SIGMAS * se:
            return (f"token {x} was committed in {c / TRIALS:.4f} of {TRIALS} trials; p[{x}] = {px:.4f} (more than "
                    f"{SIGMAS:g} standard errors off: the output must be distributed as p)")
    want = sum(min(a, b) for a, b in zip(p, q))
    se = math.sqrt(max(want * (1 - want), 1 / TRIALS) / TRIALS)
    if abs(accepted / TRIALS - want) > SIGMAS * se:
        return (f"accepted {accepted / TRIALS:.4f} of the drafts; speculative sampling accepts sum(min(p, q)) = "
                f"{want:.4f}")
    return None


def rejection_checks(fn: Callable | None) -> Iterator[tuple[str, Callable[[], str | None]]]:
    """The checks of ``verify_one`` (the student's function ``fn``), named, in order."""
    (p, q, d, u, r), calls = REPEATED
    yield (f"verify_one(p={p}, q={q}, draft={d}, u={u}, r={r}), called {calls} times",
           functools.partial(_repeated_case, fn, p, q, d, u, r, calls))
    for (p, q, d, u, r), expected in REJECTION_LITERAL:
        yield (f"verify_one(p={p}, q={q}, draft={d}, u={u}, r={r})",
               functools.partial(_literal_case, fn, p, q, d, u, r, expected))
    for i, (p, q) in enumerate(PAIRS):
        yield (f"{TRIALS} drafts from q={[round(x, 3) for x in q]} verified against p={[round(x, 3) for x in p]}",
               functools.partial(_distribution_case, fn, p, q, 100 + i))
