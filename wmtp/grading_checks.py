"""The checks of assignments 01-03 (tutorials/assignments/), which ``wmtp grade`` runs in order
(wmtp/grading.py): each a core piece of Windowed-MTP (arXiv 2607.21535), the key set (Sec. 3), the
ring-buffer slot and greedy verification (Sec. 2); assignment 04's split-K merge is in
wmtp/grading_merge.py.

A check is ``(case, thunk)``: the case named as the student would call it, and a thunk returning
``None`` when the student's function is right, else why not (what was expected, what came back,
a hint for the common mistakes). Literal cases come first, so the first failure is a readable one;
then fuzzed cases against the library's own definitions, and for 02 and 03 what the formula is for
(the ring's no-evicted-read simulation, the oracle-draft lossless harness).
"""

from __future__ import annotations

import functools
import itertools
import operator
import random
from typing import Callable, Iterator

import torch

from . import decode
from .decode import verify_greedy
from .keyset import draft_key_indices
from .kvcache import ring_slot

N_FUZZ = 300  # fuzzed cases per assignment (seeded: every student gets the same cases)


class GraderError(RuntimeError):
    """The grader itself is out of date with the library (never the student's fault)."""


Check = tuple[str, Callable[[], "str | None"]]  # (the case, named; a thunk: None if right, else why not)


# ---------------------------------------------------------------- 01 the key set
KEYSET_LITERAL = [  # (t, n_sink, window) -> keys; the regimes of STYLE.md lesson 2
    ((19, 2, 6), [0, 1, 14, 15, 16, 17, 18, 19]),  # t+1 > n_sink+window: two ranges
    ((2, 4, 6), [0, 1, 2]),  # t+1 <= n_sink: only sinks exist yet (they overlap the window)
    ((5, 4, 6), [0, 1, 2, 3, 4, 5]),  # n_sink < t+1 <= n_sink+window
    ((9, 4, 6), list(range(10))), ((10, 4, 6), [0, 1, 2, 3, 5, 6, 7, 8, 9, 10]),  # ranges touch; first gap
    ((7, 0, 3), [5, 6, 7]), ((7, 2, 1), [0, 1, 7]),  # n_sink=0: pure sliding window; window=1: itself only
    ((7, 2, None), list(range(8))), ((0, 0, 1), [0]), ((0, 3, None), [0]),  # None: full causal set
]


def as_int(x) -> int | None:
    """``x`` as an int if it is one (numpy's and a 0-d integer tensor's included), else None (a bool,
    a float, anything else): the graders' one test of an int answer."""
    if isinstance(x, bool) or isinstance(x, torch.Tensor) and (x.dim() or x.dtype == torch.bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def to_int(x) -> int:
    """``as_int(x)``, or ``TypeError`` for anything it refuses (a grader that reads a structure of ints)."""
    if (value := as_int(x)) is None:
        raise TypeError(f"{x!r} is not an int")
    return value


def _keyset_case(fn, t, n_sink, window, expected) -> str | None:
    answer = fn(t, n_sink, window)
    got = answer.tolist() if isinstance(answer, torch.Tensor) else answer
    ints = [as_int(k) for k in got] if isinstance(got, (list, tuple)) else [None]
    if None in ints:
        return f"expected the list of ints {expected}, got {answer!r}"
    if ints == expected:
        return None
    got, hint = ints, ""
    if len(set(got)) < len(got):
        dup = sorted({k for k in got if got.count(k) > 1})
        hint = f" (keys {dup} appear twice: a key that is both a sink and in the window is read once)"
    elif len(got) != len(expected):
        hint = f" ({len(got)} keys; the set holds min(t + 1, n_sink + window) = {len(expected)})"
    elif got != sorted(got):
        hint = " (return the keys in ascending order)"
    return f"expected {expected}, got {got}{hint}"


def keyset_checks(fn) -> Iterator[Check]:
    rng = random.Random(0)
    fuzz = [(rng.randrange(64), rng.randrange(9), rng.choice([None, *range(1, 21)])) for _ in range(N_FUZZ)]
    cases = KEYSET_LITERAL + [(c, draft_key_indices(*c).tolist()) for c in fuzz]
    for (t, n_sink, window), expected in cases:
        yield (f"draft_key_indices(t={t}, n_sink={n_sink}, window={window})",
               functools.partial(_keyset_case, fn, t, n_sink, window, expected))


# ---------------------------------------------------------------- 02 the ring slot
RING_LITERAL = [  # (p, n_sink, window, depth) -> slot; the ring holds n_sink + window + depth slots
    ((0, 4, 6, 2), 0), ((3, 4, 6, 2), 3), ((4, 4, 6, 2), 4), ((11, 4, 6, 2), 11), ((12, 4, 6, 2), 4),
    ((13, 4, 6, 2), 5), ((25, 4, 6, 2), 9), ((7, 0, 1, 0), 0), ((9, 2, 3, 0), 3), ((9, 0, 4, 3), 2),
]
RING_SIMULATED = [(4, 6, 2), (0, 1, 0), (0, 3, 2), (2, 1, 3), (3, 5, 0), (1, 4, 4), (8, 16, 3)]


def _ring_case(fn, args, expected) -> str | None:
    answer, (p, n_sink, _, _) = fn(*args), args
    got = as_int(answer)
    if got is None:
        return f"expected the int {expected}, got {answer!r}"
    if got == expected:
        return None
    hint = f" (slot {got} is pinned to sink {got}: writing there evicts a sink)" if p >= n_sink > got else ""
    if not hint and p >= n_sink and got == n_sink + (p - n_sink) % args[2]:
        hint = " (window + depth slots rotate: a step writes its depth drafts while the window is still read)"
    return f"expected {expected}, got {got}{hint}"


def ring_no_evicted_read(fn, n_sink, window, depth) -> str | None:
    """Simulate the ring with slot function ``fn``: None if no read lands on an overwritten slot.

    For each query ``t`` in turn, positions up to ``t + depth`` are written (a speculative step's
    drafts), then every key of ``t``'s key set is read from its slot and must still be there.
    """
    capacity, owner = n_sink + window + depth, {}
    for t in range(3 * capacity + 5):
        for p in range(t, t + depth + 1):  # a speculative step writes t .. t+depth (rewrites are harmless)
            answer = fn(p, n_sink, window, depth)
            slot = as_int(answer)
            if slot is None or not 0 <= slot < capacity:
                return f"position {p} got slot {answer!r}, outside the ring's {capacity} slots"
            owner[slot] = p
        for j in draft_key_indices(t, n_sink, window).tolist():
            slot = as_int(fn(j, n_sink, window, depth))
            if owner.get(slot) != j:
                return (f"query t={t} reads key {j} from slot {slot}, but position {owner.get(slot)} overwrote it "
                        f"(positions up to {t + depth} written)")
    return None


def ring_checks(fn) -> Iterator[Check]:
    rng = random.Random(1)
    fuzz = [(rng.randrange(200), rng.randrange(9), rng.randrange(1, 17), rng.randrange(9)) for _ in range(N_FUZZ)]
    for args, expected in RING_LITERAL + [(a, ring_slot(*a)) for a in fuzz]:
        p, n_sink, window, depth = args
        yield (f"ring_slot(p={p}, n_sink={n_sink}, window={window}, depth={depth})",
               functools.partial(_ring_case, fn, args, expected))
    for n_sink, window, depth in RING_SIMULATED:
        yield (f"no-evicted-read simulation (n_sink={n_sink}, window={window}, depth={depth})",
               functools.partial(ring_no_evicted_read, fn, n_sink, window, depth))


# ---------------------------------------------------------------- 03 greedy verification
VERIFY_LITERAL = [  # (drafts, target_choice) -> accepted
    (([1, 2, 3], [1, 2, 3, 9]), 3), (([1, 2, 3], [1, 2, 4, 0]), 2), (([1, 2, 3], [0, 2, 3, 0]), 0),
    (([5], [5, 1]), 1), (([5], [4, 5]), 0), (([1, 2, 1, 2], [1, 2, 1, 2, 1]), 4), (([7, 7, 8], [7, 6, 8, 8]), 1),
]
HARNESS_DEPTH, HARNESS_KEYSETS = 3, ((4, 16), (0, None))  # (n_sink, window): windowed and full


def _verify_case(fn, drafts, choice, expected) -> str | None:
    answer = fn(list(drafts), list(choice))
    got = as_int(answer)
    if got is None:
        return f"expected the int {expected}, got {answer!r}"
    hint = (f" (at most the {len(drafts)} drafts are accepted: target_choice[{len(drafts)}] is the target's own token)"
            if got > len(drafts) else " (acceptance stops at the first mismatch)" if got > expected else "")
    return None if got == expected else f"expected {expected}, got {got}{hint}"


class OracleDraft:
    """A draft right for the first ``j`` drafts of every step, then wrong (STYLE.md lesson 7).

    It has the MTP head's call signature (and its ``new_cache`` and ``write_cache``, the real head's);
    its hidden output carries the draft index, so a recursive call knows which draft it makes (the
    extend call, fed target hidden states, makes draft 0).
    """

    SENTINEL = 1e6

    def __init__(self, head, sequence: torch.Tensor, j: int, vocab: int):
        self.head, self.seq, self.j, self.vocab = head, sequence, j, vocab

    def new_cache(self, *args, **kwargs):
        return self.head.new_cache(*args, **kwargs)

    def write_cache(self, *args):
        return self.head.write_cache(*args)

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        last = float(hidden[0, -1, 0])
        index = int(last - self.SENTINEL) + 1 if last >= self.SENTINEL else 0
        t = int(pos[-1])
        truth = int(self.seq[t + 2]) if t + 2 < len(self.seq) else 0
        logits = torch.zeros(1, hidden.shape[1], self.vocab, dtype=hidden.dtype, device=hidden.device)
        logits[0, -1, truth if index < self.j else (truth + 1) % self.vocab] = 1.0
        return logits, torch.full_like(hidden, self.SENTINEL + index)


@functools.lru_cache(maxsize=1)
def harness_models():
    """The tiny target, float64, weights re-drawn wide so greedy output varies (as tests/test_lossless.py)."""
    from . import build_models

    target, head = build_models("tiny", seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in (p for p in target.parameters() if p.dim() == 2):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return target.double(), head.double()


def _student_verifier(fn, calls: list[int]) -> Callable[[torch.Tensor, torch.Tensor], int]:
    """``fn`` on lists, as a ``verify_greedy``-shaped verifier that counts its calls in ``calls[0]``."""

    def verifier(drafts: torch.Tensor, target_choice: torch.Tensor) -> int:
        calls[0] += 1
        answer = fn(drafts.tolist(), target_choice.tolist())
        got = as_int(answer)
        if got is None or not 0 <= got <= drafts.shape[0]:
            raise ValueError(f"accept_count({drafts.tolist()}, {target_choice.tolist()}) returned {answer!r}")
        return got

    return verifier


def lossless_harness(fn, j, n_sink, window) -> str | None:
    """Speculative decoding with ``fn`` as verifier and an oracle draft right for ``j`` tokens a step.

    Returns None if the output equals dense greedy decoding token for token, else what differs.
    """
    target, head = harness_models()
    prompt = torch.randint(0, target.config.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    ref = decode.greedy_generate(target, prompt, 24)
    seq = torch.cat([prompt, ref, torch.zeros(HARNESS_DEPTH + 2, dtype=torch.long)])
    draft = OracleDraft(head, seq, j, target.config.vocab_size)
    calls = [0]
    out, _ = decode.speculative_generate(target, draft, prompt, 24, HARNESS_DEPTH, n_sink, window,
                                         verifier=_student_verifier(fn, calls))
    if calls[0] == 0:
        raise GraderError("speculative_generate never called the student's verifier")
    if torch.equal(out, ref):
        return None
    first = next((i for i, (a, b) in enumerate(zip(out.tolist(), ref.tolist())) if a != b), min(len(out), len(ref)))
    return (f"output differs from dense greedy from token {first}: expected {ref.tolist()}, got {out.tolist()} "
            "(a wrong accept count commits a token the target did not choose)")


def verify_checks(fn) -> Iterator[Check]:
    rng = random.Random(2)
    fuzz = []
    for _ in range(N_FUZZ):
        k = rng.randrange(1, 9)
        choice = [rng.randrange(3) for _ in range(k + 1)]
        fuzz.append(([c if rng.random() < 0.7 else rng.randrange(3) for c in choice[:k]], choice))
    oracle = [(c, verify_greedy(torch.tensor(c[0]), torch.tensor(c[1]))) for c in fuzz]
    for (drafts, choice), expected in VERIFY_LITERAL + oracle:
        yield (f"accept_count(drafts={drafts}, target_choice={choice})",
               functools.partial(_verify_case, fn, drafts, choice, expected))
    for (n_sink, window), j in itertools.product(HARNESS_KEYSETS, range(HARNESS_DEPTH + 1)):
        yield (f"lossless harness: speculative_generate with your accept_count, an oracle draft right for exactly "
               f"j={j} of depth={HARNESS_DEPTH} drafts per step, n_sink={n_sink}, window={window}",
               functools.partial(lossless_harness, fn, j, n_sink, window))
