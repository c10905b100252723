"""Reference solution to assignment 03: greedy verification of draft tokens.

One speculative step (arXiv 2607.21535, Sec. 2-3; wmtp/decode.py): the draft proposes
``d_1 .. d_K``; one target pass over ``[x, d_1 .. d_K]`` gives the target's greedy choices
``y_0 .. y_K``, where ``y_i`` is the target's argmax after the prefix ending in ``d_i``.
Draft ``d_i`` is accepted while ``d_i == y_{i-1}``; the step commits the accepted drafts plus
``y_a``, the target's own token after ``a`` accepted drafts. Every committed token is then the
target's greedy choice, so speculative output equals dense greedy output token for token
(``docs/concepts.md#losslessness``), whatever the draft proposes.

Acceptance stops at the FIRST mismatch: once ``d_i`` is rejected, ``y_i ..`` were computed after
a wrong token and say nothing about the true continuation, even where they happen to match.

Your task: implement ``accept_count`` below (plain Python, lists of token ids).

Grade it:

    wmtp grade greedy_verify tutorials/assignments/03_greedy_verify.py

The grader checks literal cases, 300 fuzzed cases against ``wmtp.decode.verify_greedy``, and then
the oracle-draft lossless harness: it runs ``wmtp.speculative_generate`` on a tiny target with
YOUR function as the verifier and a draft right for exactly j tokens per step (j = 0..depth), and
requires the output to equal dense greedy decoding token for token.
"""

from __future__ import annotations


def accept_count(drafts: list[int], target_choice: list[int]) -> int:
    """Number of drafts accepted: the length of the longest prefix with ``drafts[i] == target_choice[i]``.

    Args:
        drafts: the K draft tokens ``d_1 .. d_K``.
        target_choice: the K + 1 target tokens ``y_0 .. y_K``.

    Returns:
        The accept length ``a``, in ``0 .. K``.
    """
    accepted = 0
    for draft, choice in zip(drafts, target_choice):
        if draft != choice:
            break  # nothing after the first mismatch counts
        accepted += 1
    return accepted
