"""Reference solution to assignment 10: a batch's commit, each row at its own position.

A batch of ``B`` prompts decodes as one: one pass of the head and of the target serves every row
(wmtp/batched.py, beyond arXiv 2607.21535, whose runs decode one sequence; its step is Sec. 2-3's).
Row ``b``'s latest committed token sits at ``positions[b]``. In one verify pass the row has drafted
``K`` tokens ``drafts[b]`` (the same ``K`` for every row), and ``choices[b]`` (``K + 1`` tokens) is
the target's greedy token after each prefix of them: ``choices[b][i]`` follows the row's committed
tokens and its first ``i`` drafts (assignment 03).

Each row keeps its OWN matches. A live row accepts ``a_b``, the length of the longest prefix with
``drafts[b][i] == choices[b][i]`` (acceptance stops at the first mismatch), commits
``drafts[b][:a_b] + [choices[b][a_b]]`` (its accepted drafts, then the target's own token) and
moves to ``positions[b] + a_b + 1``, the position of its latest committed token. A row with
``live[b] == False`` has stopped (its end-of-sequence token or its token budget): it commits
nothing and stays at ``positions[b]``, whatever its drafts and choices say.

Lockstep batching (wmtp/lockstep.py) keeps every row at one position, so it commits the batch's
least match ``min_b a_b`` for every row: exact, but a row that drafted well waits for the row
that drafted worst. With a position a row, no row waits for another.

Your task: implement ``commit_rows`` below (plain Python, lists of token ids). Return one
``(tokens, new_position)`` pair a row, in the rows' order. Do not change the arguments; you need
not validate them.

Grade it:

    wmtp grade batch tutorials/assignments/10_batch_commit.py

The grader checks literal batches, 300 fuzzed batches against ``wmtp.decode.verify_greedy`` row by
row, and then a batched loop that commits through your function: prompts of different lengths on
a tiny target, drafts right for exactly j tokens a row and a step (j = 0..K), the target's choices
from each row's greedy output. Each step every live row must commit its own accepted drafts and
its target token (lockstep's least match is exact, but fails here), every row's output must equal
its greedy decoding token for token, its position must follow its committed tokens, and a stopped
row must stay where it stopped.
"""

from __future__ import annotations


def commit_rows(drafts: list[list[int]], choices: list[list[int]], positions: list[int],
                live: list[bool]) -> list[tuple[list[int], int]]:
    """What each row of a batch commits after one verify pass, and its new position.

    Args:
        drafts: ``B`` lists of ``K`` draft tokens (``K >= 1``), one a row.
        choices: ``B`` lists of ``K + 1`` target tokens: ``choices[b][i]`` is the target's greedy
            token after row ``b``'s first ``i`` drafts.
        positions: the position of each row's latest committed token.
        live: ``False`` for a row that has stopped.

    Returns:
        ``[(tokens, new_position), ...]``, one a row: ``(drafts[b][:a_b] + [choices[b][a_b]],
        positions[b] + a_b + 1)`` for a live row, ``([], positions[b])`` for a stopped one.
    """
    rows = []
    for row_drafts, row_choices, position, on in zip(drafts, choices, positions, live):
        if not on:
            rows.append(([], position))  # a stopped row commits nothing and stays
            continue
        a = 0  # this row's own match, whatever the other rows accept
        while a < len(row_drafts) and row_drafts[a] == row_choices[a]:
            a += 1  # nothing after the first mismatch counts
        rows.append((row_drafts[:a] + [row_choices[a]], position + a + 1))  # its accepted drafts, the target's token
    return rows
