"""Assignment 10's checks (``wmtp grade batch``): ``commit_rows``, the commit of one verify pass of
a batch whose rows sit at their own positions (wmtp/batched.py): the commit of arXiv 2607.21535,
Sec. 2-3, made a row at a time, beyond the paper, whose runs decode one sequence. Each live row
keeps its own accepted drafts and its target token; lockstep (wmtp/lockstep.py) would keep the
batch's least match for every row.

Checked in order (wmtp/grading.py runs them and stops at the first failure): literal batches
(matches that differ by row, all drafts accepted, a stopped row, one row, one draft, positions that
differ by row), ``wmtp.decode.verify_greedy`` row by row on fuzzed batches, and then what the commit
is for: a batch of prompts of different lengths decoded by a loop that commits through the
student's function, with drafts right for exactly ``j`` tokens a row and a step (``j = 0 .. K``)
and the target's choices taken from each row's ``greedy_generate`` on the tiny float64 target
(random past the first mismatch). Each step a live row must commit its own ``j`` drafts and its
target token (lockstep's least match, exact but slower, fails here too); every row's output must be
its greedy continuation token for token, its position its prompt's last plus its committed
tokens, and a stopped row must stay put. Every call gets copies of the batch, and must leave them
unchanged (the task says so).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator

import torch

from . import decode
from .decode import verify_greedy
from .grading_checks import harness_models, to_int

__all__ = ["BATCH_LITERAL", "batch_checks", "library_commit"]

Rows = list[tuple[list[int], int]]  # one (committed tokens, new position) a row
T, F = True, False
BATCH_LITERAL = [  # (drafts, choices, positions, live) -> one (tokens, new_position) a row
    (([[4, 7, 1], [4, 7, 1], [2, 2, 2]], [[4, 7, 1, 9], [4, 3, 0, 5], [8, 2, 2, 2]], [10, 10, 10], [T, T, T]),
     [([4, 7, 1, 9], 14), ([4, 3], 12), ([8], 11)]),  # a_b = 3, 1, 0: each row its own
    (([[5, 6], [5, 6], [1, 1]], [[5, 6, 3], [5, 0, 6], [1, 2, 1]], [3, 17, 0], [T, T, T]),
     [([5, 6, 3], 6), ([5, 0], 19), ([1, 2], 2)]),  # positions that differ by row
    (([[3, 3], [8, 9]], [[3, 3, 4], [8, 9, 9]], [7, 2], [T, T]),
     [([3, 3, 4], 10), ([8, 9, 9], 5)]),  # every draft accepted: the drafts and choices[K]
    (([[1, 2, 3], [1, 2, 3], [0, 5, 5]], [[1, 2, 3, 4], [1, 2, 3, 4], [0, 6, 5, 5]], [9, 4, 6], [T, F, T]),
     [([1, 2, 3, 4], 13), ([], 4), ([0, 6], 8)]),  # a stopped row, though its drafts all match
    (([[2, 2], [7, 7], [4, 1]], [[2, 2, 0], [1, 7, 7], [4, 1, 6]], [5, 8, 1], [T, F, T]),
     [([2, 2, 0], 8), ([], 8), ([4, 1, 6], 4)]),  # the stopped row's a = 0 holds no live row back
    (([[6]], [[6, 2]], [3], [T]), [([6, 2], 5)]),  # one row, one draft, accepted
    (([[6], [6]], [[5, 6], [6, 6]], [0, 12], [T, T]), [([5], 1), ([6, 6], 14)]),  # one draft, rejected and not
    (([[1, 2, 1, 2]], [[1, 3, 1, 2, 1]], [20], [T]), [([1, 3], 22)]),  # matches past the first mismatch don't count
    (([[4, 4], [5, 5]], [[4, 4, 4], [5, 5, 5]], [2, 3], [F, F]), [([], 2), ([], 3)]),  # every row stopped
]
# (K, prompt lengths, new tokens a row, seed): seeds under which the rows stop at different steps,
# so that a stopped row sits beside live ones (tests/test_grading_harness.py checks it)
HARNESS = [(3, (5, 9, 2), 16, 2), (1, (4, 1, 7, 3), 12, 1), (5, (12, 3), 24, 4), (2, (6,), 10, 0),
           (4, (2, 8, 5, 11, 1), 20, 3)]


def library_commit(drafts: list[list[int]], choices: list[list[int]], positions: list[int],
                   live: list[bool]) -> Rows:
    """The library's answer: ``wmtp.decode.verify_greedy`` on each live row, as wmtp/batched.py commits."""
    rows = []
    for d, c, p, on in zip(drafts, choices, positions, live):
        a = verify_greedy(torch.tensor(d), torch.tensor(c)) if on else -1  # a_b, the row's own match
        rows.append((d[:a] + [c[a]], p + a + 1) if on else ([], p))
    return rows


def _lockstep(drafts, choices, positions, live) -> Rows:
    """Lockstep's rule (wmtp/lockstep.py): every live row keeps the live rows' least match."""
    own = [verify_greedy(torch.tensor(d), torch.tensor(c)) for d, c, on in zip(drafts, choices, live) if on]
    m = min(own, default=0)
    return [(d[:m] + [c[m]], p + m + 1) if on else ([], p) for d, c, p, on in zip(drafts, choices, positions, live)]


def _as_rows(got, B: int) -> Rows:
    """The student's answer as ``B`` (tokens, position) pairs of ints; TypeError or ValueError if not."""
    rows = [([to_int(t) for t in tokens], to_int(position)) for tokens, position in got]
    if len(rows) != B:
        raise ValueError(f"{len(rows)} pairs for a batch of {B} rows")
    return rows


def _call(fn, drafts, choices, positions, live) -> Rows | str:
    """``fn`` on copies of the batch (the grader's stay as they are), or why its answer is not one:
    an answer that changed its arguments is not one (the task says not to)."""
    before = ([list(d) for d in drafts], [list(c) for c in choices], list(positions), list(live))
    args = ([list(d) for d in drafts], [list(c) for c in choices], list(positions), list(live))
    got = fn(*args)
    for name, old, new in zip(("drafts", "choices", "positions", "live"), before, args):
        if new != old:
            return (f"commit_rows changed its argument {name} from {old} to {new}: do not change the arguments "
                    "(build new lists for the answer)")
    try:
        return _as_rows(got, len(drafts))
    except (TypeError, ValueError) as e:
        return (f"expected a list of {len(drafts)} (tokens, new_position) pairs, one a row, tokens a list of ints and "
                f"new_position an int; got {got!r} ({e})")


def _hint(got: Rows, expected: Rows, args: tuple) -> str:
    drafts, choices, positions, live = args
    if got == _lockstep(*args):
        return (" (each row keeps its own match a_b; committing the batch's least match min_b a_b for every row "
                "is lockstep's rule, wmtp/lockstep.py)")
    b = next(i for i in range(len(got)) if got[i] != expected[i])
    (tokens, position), (want, want_position) = got[b], expected[b]
    if not live[b]:
        return f" (row {b} has stopped: it commits nothing and stays at position {positions[b]})"
    a = len(want) - 1
    if tokens == drafts[b][:a]:
        return f" (row {b} also commits the target's token choices[{b}][{a}] after its {a} accepted drafts)"
    if len(tokens) == len(want) and tokens[:-1] == want[:-1] and tokens[-1] != want[-1]:
        return (f" (row {b}'s last token is the target's choices[{b}][{a}] = {want[-1]}, its token after the row's "
                f"{a} accepted drafts)")
    if tokens == want and position == want_position - 1:
        return f" (row {b} commits a_b + 1 = {a + 1} tokens: its new position is positions[b] + a_b + 1)"
    if tokens == want:
        return f" (the new position is the row's latest committed token's: positions[{b}] + {len(want)})"
    if len(tokens) > len(want):
        return f" (row {b}'s acceptance stops at its first mismatch)"
    return ""


def _batch_case(fn, args: tuple, expected: Rows) -> str | None:
    got = _call(fn, *args)
    if isinstance(got, str):
        return got
    if got == expected:
        return None
    return f"expected {expected}, got {got}" + _hint(got, expected, args)


def _accept_lengths(rng: random.Random, K: int, n: int) -> list[int]:
    """``n`` accept lengths in ``0 .. K``: each one in the first ``K + 1`` steps (every row of HARNESS
    lives that long), then drawn at random, so that the rows stop at different steps."""
    return (rng.sample(range(K + 1), K + 1) + [rng.randrange(K + 1) for _ in range(n)])[:n]


def _harness_case(fn, K: int, lengths: tuple[int, ...], max_new: int, seed: int) -> str | None:
    """Prompts of ``lengths`` decoded as one batch, committed by ``fn``, against each row's greedy output."""
    target, _ = harness_models()
    V, B, g, rng = target.config.vocab_size, len(lengths), torch.Generator().manual_seed(seed), random.Random(seed)
    prompts = [torch.randint(0, V, (n,), generator=g) for n in lengths]
    seqs = [p.tolist() + decode.greedy_generate(target, p, max_new + K).tolist() for p in prompts]  # K spare
    out, pos, live = [[] for _ in range(B)], [n - 1 for n in lengths], [True] * B  # the prompt's last is committed
    committed, js = [0] * B, [_accept_lengths(rng, K, max_new) for _ in range(B)]
    for step in range(max_new):  # a live row commits at least one token a step
        if not any(live):
            break
        drafts, choices = [], []
        for b in range(B):
            if not live[b]:  # what a stopped row computes is dropped: drafts that all match, to tempt a commit
                drafts.append([rng.randrange(V) for _ in range(K)])
                choices.append(drafts[-1] + [rng.randrange(V)])
                continue
            j, truth = js[b][step], seqs[b][pos[b] + 1: pos[b] + K + 2]  # (K + 1,) the target's greedy tokens
            d = truth[:j] + [(truth[j] + 1 + rng.randrange(V - 1)) % V]  # right for j, then wrong
            d = (d + [rng.randrange(V) for _ in range(K)])[:K]
            drafts.append(d)  # past the mismatch the target's choices are arbitrary: half of them echo the drafts
            choices.append(truth[:j + 1] + [d[i] if i < K and rng.random() < 0.5 else rng.randrange(V)
                                            for i in range(j + 1, K + 1)])
        got = _call(fn, drafts, choices, pos, live)
        if isinstance(got, str):
            return f"step {step}, drafts={drafts}, choices={choices}, positions={pos}, live={live}: {got}"
        for b, (tokens, position) in enumerate(got):
            where = f"step {step}, row {b} (prompt length {lengths[b]}, at position {pos[b]})"
            if not live[b]:
                if tokens or position != pos[b]:
                    return f"{where} has stopped, but it committed {tokens} and moved to position {position}"
                continue
            j = js[b][step]
            want = seqs[b][pos[b] + 1: pos[b] + j + 2]  # its j accepted drafts and its target token
            if tokens != want:
                why = ""
                if len(tokens) < len(want) and tokens == want[:len(tokens)]:
                    why = (f" (the row keeps all its own a_b = {j} accepted drafts, then the target's token "
                           f"choices[{b}][{j}]: {j + 1} tokens, whatever the other rows accept)")
                return (f"{where}: drafts {drafts[b]}, right for the first {j}, and choices {choices[b]}: it committed "
                        f"{tokens}, expected {want}{why}")
            committed[b] += len(tokens)
            if position != lengths[b] - 1 + committed[b]:
                return (f"{where} committed {tokens} and moved to position {position}, expected {lengths[b] - 1} (its "
                        f"prompt's last token) + {committed[b]} (its tokens committed so far) = "
                        f"{lengths[b] - 1 + committed[b]}")
            out[b], pos[b] = (out[b] + tokens)[:max_new], position
            live[b] = len(out[b]) < max_new
    for b in range(B):
        if out[b] != seqs[b][lengths[b]: lengths[b] + max_new]:
            return f"row {b} output {out[b]}, its greedy continuation {seqs[b][lengths[b]: lengths[b] + max_new]}"
    return None


def batch_checks(fn: Callable | None, n_fuzz: int) -> Iterator[tuple[str, Callable[[], str | None]]]:
    """The checks of ``commit_rows`` (the student's function ``fn``), named, in order."""
    rng = random.Random(10)
    fuzz = []
    for _ in range(n_fuzz):
        B, K = rng.randrange(1, 6), rng.randrange(1, 7)
        choices = [[rng.randrange(3) for _ in range(K + 1)] for _ in range(B)]
        drafts = [[y if rng.random() < 0.7 else rng.randrange(3) for y in c[:K]] for c in choices]
        fuzz.append((drafts, choices, [rng.randrange(100) for _ in range(B)], [rng.random() < 0.8 for _ in range(B)]))
    for args, expected in BATCH_LITERAL + [(a, library_commit(*a)) for a in fuzz]:
        drafts, choices, positions, live = args
        yield (f"commit_rows(drafts={drafts}, choices={choices}, positions={positions}, live={live})",
               functools.partial(_batch_case, fn, args, expected))
    for K, lengths, max_new, seed in HARNESS:
        yield (f"batched loop: prompts of {list(lengths)} tokens, K={K} drafts right for j = 0 .. {K} per row and "
               f"step, {max_new} new tokens a row, committed by your commit_rows",
               functools.partial(_harness_case, fn, K, lengths, max_new, seed))
