"""Reference solution to assignment 06: speculative sampling's rule for one drafted token.

With sampled decoding the draft's token ``draft`` was drawn from the draft's distribution ``q``,
and the target's distribution at that position is ``p``. Speculative sampling (Leviathan et al.
2023; Chen et al. 2023; ``wmtp.verify_rejection`` applies it token by token, and Windowed-MTP's
window changes only ``q``) keeps the output distributed exactly as the target's:

    accept the draft when u * q[draft] < p[draft]          (probability min(1, p[draft] / q[draft]))
    otherwise commit a sample of max(p - q, 0), normalised

``docs/concepts.md#sampled-verification`` and tutorial 07 explain why the committed token then
follows ``p`` whatever ``q`` is, and why acceptance is ``sum(min(p, q))``.

Your task: implement ``verify_one`` below in plain Python. ``u`` and ``r`` are two independent
uniforms in ``[0, 1)``: use ``u`` for the acceptance test and ``r`` to sample the residual by
inverse CDF (the first token whose cumulative residual mass exceeds ``r`` times the total: so a
token without residual mass is never committed, even at ``r = 0``). They are the only randomness:
draw no random numbers of your own, so that the same arguments always give the same token.
Return the committed token: ``draft`` if accepted, else the residual's sample (which is never the
draft: a rejected draft has ``p[draft] < q[draft]``, so no residual mass).

Grade it:

    wmtp grade rejection tutorials/assignments/06_rejection_sampling.py

The grader checks that one call repeated gives one token, then literal cases, then runs 20000
seeded drafts for each of eight pairs ``(p, q)``: the committed tokens must be distributed as ``p``,
and the drafts accepted in ``sum(min(p, q))`` of the trials.
"""

from __future__ import annotations


def verify_one(p: list[float], q: list[float], draft: int, u: float, r: float) -> int:
    """The token committed at one drafted position.

    Args:
        p: the target's distribution over the vocabulary (sums to 1).
        q: the draft's distribution (sums to 1); ``draft`` was sampled from it.
        draft: the drafted token.
        u: a uniform in ``[0, 1)`` for the acceptance test.
        r: a uniform in ``[0, 1)`` for the residual's sample.

    Returns:
        ``draft`` if accepted, else a token sampled from ``max(p - q, 0)`` (normalised).
    """
    if u * q[draft] < p[draft]:  # accept with probability min(1, p[draft] / q[draft])
        return draft
    residual = [max(a - b, 0.0) for a, b in zip(p, q)]  # where the target wants more than the draft gave
    target, total = r * sum(residual), 0.0
    for token, mass in enumerate(residual):
        total += mass
        if total > target:
            return token
    return max(range(len(residual)), key=residual.__getitem__)  # rounding at the top end: the last with mass
