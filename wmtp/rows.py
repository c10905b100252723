"""A batch's rows: the prompts prefilled as one batch, a waiting prompt prefilled into a row that has
stopped, and which prompt each row decodes (beyond the paper, whose runs decode one sequence; arXiv
2607.21535 Sec. 2: a prefill writes both KV caches before the first step).

wmtp/batched.py and wmtp/static_batched.py (and the dense batches of wmtp/lockstep.py and
wmtp/static_lockstep.py) start from ``prefill_rows``; with ``max_batch`` below the number of prompts
the speculative loops refill stopped rows (NOTE [Refill] in wmtp/batched.py): an ``Admitter`` puts a
waiting prompt into a row, prefilled alone straight into the row of both caches (``admit``, through
``KVCache.row``) or, with ``prefill_batch`` above 1, prefilled with the next waiting prompts as one
batch and copied in; ``Slots`` keeps which prompt each row holds, each prompt's output and its
counters and times in ``BatchedStats``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .checks import check_int
from .decode import _finish
from .device import synchronize
from .kvcache import KVCache
from .model import TargetLM
from .mtp import MTPHead

if TYPE_CHECKING:
    from .batched import BatchedStats

__all__ = ["Admitter", "Slots", "admit", "as_rows", "batch_rows", "prefill_rows", "timed"]


def as_rows(prompts) -> list[torch.Tensor]:
    """The prompts as a list of 1-D tensors: a ``(B, P)`` tensor's rows, or a list as given.

    Raises:
        ValueError: for anything else, or no prompt.
    """
    if isinstance(prompts, torch.Tensor) and prompts.dim() == 2 and prompts.numel():
        return list(prompts)
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, torch.Tensor) for p in prompts):
        return list(prompts)
    raise ValueError("prompts must be a non-empty (B, P) tensor or a non-empty list of 1-D token-id tensors")


def prefill_rows(target: TargetLM, draft: MTPHead | None, rows: list[torch.Tensor], needed: int, impl: str,
                 checked: bool = True, into: tuple[KVCache, KVCache | None] | None = None):
    """The prompts prefilled as one batch, padded at their ends (NOTE [Padded rows] in wmtp/batched.py):
    the target over the prompts, then the head's cache write (if a head) over their true chains,
    positions ``0 .. P_b - 2`` (NOTE [Shared draft prefill] in wmtp/prefill.py). Into new caches of
    ``needed`` positions (``checked``: their range check, off for the static loops), or into
    ``into``'s (a row's views: ``admit``). Returns both caches (the head's ``None`` without a head),
    each row's first new token ``(B,)``, its target hidden state at its last prompt position
    ``(B, d)`` and the prompts' lengths ``(B,)``."""
    B, dev = len(rows), rows[0].device
    lengths = torch.tensor([r.numel() for r in rows], device=dev)  # (B,)
    P = int(lengths.max())
    ids = torch.zeros(B, P, dtype=torch.long, device=dev)  # (B, P): pad token 0
    for b, r in enumerate(rows):
        ids[b, : r.numel()] = r.long()
    if into is None:
        into = (target.new_cache(B, needed, checked=checked),
                None if draft is None else draft.new_cache(B, needed, checked=checked))
    tcache, dcache = into
    last = (lengths - 1)[:, None]  # (B, 1) each row's last prompt position
    logits, hidden = target(ids, torch.arange(P, device=dev), tcache, impl, last)  # (B, 1, V), (B, P, d)
    if draft is not None and P > 1:  # the head's true chains, positions 0 .. P_b - 2 (and padding past them)
        draft.write_cache(hidden[:, :-1], ids[:, 1:], torch.arange(P - 1, device=dev), dcache, impl)
    x = logits[:, 0].argmax(-1)  # (B,)
    h = hidden.gather(1, last[:, :, None].expand(-1, -1, hidden.shape[-1]))[:, 0]  # (B, d)
    return tcache, dcache, x, h, lengths


def admit(target: TargetLM, draft: MTPHead, tcache: KVCache, dcache: KVCache, b: int, prompt: torch.Tensor, impl: str
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompt`` prefilled alone straight into row ``b`` of both caches, its positions ``0 .. P - 1``
    (the head's ``0 .. P - 2``; NOTE [Refill] in wmtp/batched.py); returns its first new token ``()``
    and its target hidden state at its last prompt position ``(d,)``."""
    _, _, x, h, _ = prefill_rows(target, draft, [prompt], prompt.numel(), impl, into=(tcache.row(b), dcache.row(b)))
    return x[0], h[0]


def batch_rows(max_batch: int | None, n_prompts: int, prefill_batch: int = 1) -> int:
    """The rows a batch holds: ``max_batch`` (at most the prompts), or every prompt with ``None``.

    Raises:
        ValueError: for a ``max_batch`` that is not ``None`` or an integer >= 1, or a
            ``prefill_batch`` that is not an integer >= 1.
    """
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise ValueError(f"max_batch must be None or an integer >= 1, got {max_batch!r}")
    check_int("prefill_batch", prefill_batch, 1)
    return n_prompts if max_batch is None else min(max_batch, n_prompts)


class Admitter:
    """Waiting prompt ``i`` into row ``b`` of both caches (NOTE [Refill] in wmtp/batched.py): with
    ``prefill_batch`` 1, prefilled alone straight into the row (``admit``); above 1, prefilled with
    the next ``prefill_batch - 1`` waiting prompts as one batch into caches of their own (the stage),
    and each copied into its row when a row takes it. Prompts are taken in order, so a stage is used
    up before the next is prefilled; it holds up to ``prefill_batch`` prompts' keys and values beside
    the batch's."""

    def __init__(self, target: TargetLM, draft: MTPHead, tcache: KVCache, dcache: KVCache, impl: str,
                 prompts: list[torch.Tensor], prefill_batch: int) -> None:
        self.target, self.draft, self.tcache, self.dcache, self.impl = target, draft, tcache, dcache, impl
        self.prompts, self.prefill_batch = prompts, prefill_batch
        self.staged: dict[int, int] = {}  # a staged prompt's index -> its row in the stage
        self.stage = None  # prefill_rows' caches and outputs for the staged prompts

    def __call__(self, b: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt ``i`` into row ``b``: its first new token ``()`` and its target hidden state ``(d,)``."""
        if self.prefill_batch == 1:
            return admit(self.target, self.draft, self.tcache, self.dcache, b, self.prompts[i], self.impl)
        if i not in self.staged:
            take = self.prompts[i: i + self.prefill_batch]
            self.stage = prefill_rows(self.target, self.draft, take, max(p.numel() for p in take), self.impl)
            self.staged = {i + r: r for r in range(len(take))}
        tc, dc, x, h, _ = self.stage
        r, P = self.staged.pop(i), self.prompts[i].numel()
        for big, small, m in ((self.tcache, tc, P), (self.dcache, dc, P - 1)):  # the head's chain: 0 .. P - 2
            big.k[:, b, :, :m].copy_(small.k[:, r, :, :m])  # (n_layers, Hkv, m, D)
            big.v[:, b, :, :m].copy_(small.v[:, r, :, :m])
        if not self.staged:
            self.stage = None  # its caches go with it
        return x[r], h[r]


def timed(device: torch.device, run: Callable, keep: Callable[[float], object] | None):
    """``run()``; with ``keep``, its wall-clock seconds (after a synchronize, launches included) go to
    ``keep`` (a prefill's time: ``BatchedStats.add_prefill``, or a list's ``append``)."""
    if keep is None:
        return run()
    synchronize(device)
    t0 = time.perf_counter()
    got = run()
    synchronize(device)
    keep(time.perf_counter() - t0)
    return got


class Slots:
    """Which prompt each of a batch's ``rows`` decodes, every row's output so far ``out``
    ((tokens, stopped) a row) and the outputs of the prompts done (NOTE [Refill] in
    wmtp/batched.py); each prompt's counters and times go to ``stats``."""

    def __init__(self, stats: BatchedStats, rows: int, max_new_tokens: int, eos_id: int | None) -> None:
        self.stats, self.max_new_tokens, self.eos_id = stats, max_new_tokens, eos_id
        self.who, self.next, self.done = list(range(rows)), rows, [None] * stats.batch
        self.out: list[tuple[list[int], bool]] = [([], False)] * rows

    @property
    def waiting(self) -> bool:
        return self.next < len(self.done)

    @property
    def stopped(self) -> list[bool]:
        return [stop for _, stop in self.out]

    def start(self, b: int, token: int) -> None:
        """Row ``b``'s prompt has its first new token (from its prefill)."""
        self.out[b] = _finish([token], self.max_new_tokens, self.eos_id)
        self.stats.record(self.who[b], self.out[b][1])

    def commit(self, b: int, tokens: list[int], accepted: int) -> bool:
        """Row ``b`` kept ``tokens`` in a step, ``accepted`` of them drafts: its prompt's output and
        counters. Returns whether the row goes on (its prompt has not stopped)."""
        i, before = self.who[b], len(self.out[b][0])
        self.out[b] = _finish(self.out[b][0] + tokens, self.max_new_tokens, self.eos_id)
        self.stats.accepted[i] += accepted
        self.stats.committed[i] += len(self.out[b][0]) - before
        self.stats.live_steps[i] += 1
        self.stats.record(i, self.out[b][1])
        return not self.out[b][1]

    def refill(self, admit_row: Callable[[int, int], int]) -> None:
        """Every stopped row takes waiting prompts until it holds a live one or none wait:
        ``admit_row(b, i)`` puts prompt ``i`` into row ``b`` (an ``Admitter``), sets the row's state
        and returns its first new token."""
        for b in range(len(self.who)):
            while self.out[b][1] and self.waiting:
                self.done[self.who[b]], self.who[b], self.next = self.out[b][0], self.next, self.next + 1
                self.start(b, admit_row(b, self.who[b]))

    def outputs(self, device: torch.device) -> list[torch.Tensor]:
        """Every prompt's new tokens, in the prompts' order (after the run)."""
        for b, (tokens, _) in enumerate(self.out):
            self.done[self.who[b]] = tokens
        return [torch.tensor(o, dtype=torch.long, device=device) for o in self.done]
