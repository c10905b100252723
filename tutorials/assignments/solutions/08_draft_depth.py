"""Reference solution to assignment 08: how deep to draft.

The paper drafts a fixed number of tokens a step (arXiv 2607.21535, Sec. 4); its step-cost model
(Sec. 2) says what a deeper draft buys. With ``alphas[i - 1]`` the chance that draft ``i`` is
accepted once drafts ``1 .. i-1`` were, a step that drafts ``k`` tokens commits on average

    E[AL | k] = 1 + alpha_1 + alpha_1 alpha_2 + ... + alpha_1 alpha_2 ... alpha_k

tokens (the accepted drafts and the target's own token) and costs ``costs[k - 1]``. The best depth
delivers the most tokens per unit of cost. ``wmtp.AdaptiveDepth`` re-estimates the alphas and the
costs as it decodes and drafts this depth at every step (``docs/concepts.md#adaptive-depth``;
tutorial 09).

Your task: implement ``best_depth`` below (plain Python): the ``k`` in ``1 .. len(costs)`` with the
largest ``E[AL | k] / costs[k - 1]``, the smallest such ``k`` on a tie. ``alphas`` may be longer
than ``costs``: the depths are those of ``costs``. You need not validate arguments.

Grade it:

    wmtp grade depth tutorials/assignments/08_draft_depth.py

The grader checks literal depths, 300 fuzzed cases against ``wmtp.policy.best_depth``, and then
simulated steps at every depth (each draft accepted with its alpha until the first rejection):
your depth must deliver as many tokens per unit of cost as the best one, within the noise.
"""

from __future__ import annotations


def best_depth(alphas: list[float], costs: list[float]) -> int:
    """The draft depth with the most expected tokens per unit of step cost.

    Args:
        alphas: ``alphas[i - 1]``, the chance that draft ``i`` is accepted once drafts ``1 .. i-1``
            were (at least ``len(costs)`` of them).
        costs: ``costs[k - 1]``, the cost of a step that drafts ``k`` tokens (> 0).

    Returns:
        The depth ``k`` in ``1 .. len(costs)``.
    """
    best, best_rate = 1, float("-inf")
    expected, run = 1.0, 1.0  # E[AL | k] so far, and alpha_1 ... alpha_k
    for k in range(1, len(costs) + 1):
        run *= alphas[k - 1]  # draft k counts only if drafts 1 .. k-1 were accepted
        expected += run
        rate = expected / costs[k - 1]
        if rate > best_rate:  # strictly greater: a tie keeps the smaller depth
            best, best_rate = k, rate
    return best
