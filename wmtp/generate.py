"""Text from reproduce's models, each token marked by who wrote it: an accepted draft of the MTP
head, or the target itself (arXiv 2607.21535, Sec. 2: a step commits the drafts the target agrees
with, then one token of the target's own). ``wmtp generate`` (wmtp/generate_cli.py) prints it, and
checks it against dense greedy decoding: the marks change with the key set, the text never does.

``generate`` runs ``speculative_generate`` (or, with ``loop="graph"``, the CUDA-graph loop) with a
fixed-depth policy that hears every step's accepted count (the loop's ``policy.update``), so the
marks come from the run itself: the first token is the prefill's (the target's), then each step's
``a`` accepted drafts and the target's token, the whole cut where the output is
(``drafted_marks``). ``token_pieces`` cuts the decoded text at token boundaries, giving a character
split across byte-level tokens to the token that completes it; ``styled_text`` marks the drafts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .decode import greedy_generate, speculative_generate
from .model import TargetLM
from .mtp import MTPHead
from .policy import FixedDepth
from .stats import SpecStats

__all__ = ["Generation", "drafted_marks", "generate", "loop_functions", "styled_text", "token_pieces"]

MAX_NEW_TOKENS, MAX_DEPTH = 4096, 64  # the command line's bounds (token_pieces decodes every prefix)
DRAFT_STYLE = "bold green"  # an accepted draft, in the printed text


class _Recorder(FixedDepth):
    """``FixedDepth`` that keeps each step's accepted count (the loops' ``policy.update``) and hands
    ``on_step`` the number of tokens the step committed (its accepted drafts and the target's token)."""

    def __init__(self, depth: int, on_step: Callable[[int], object] | None = None) -> None:
        super().__init__(depth)
        self.accepts: list[int] = []
        self.on_step = on_step

    def update(self, depth: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.accepts.append(accepted)
        if self.on_step is not None:
            self.on_step(accepted + 1)


def drafted_marks(accepts: list[int], n_tokens: int) -> list[bool]:
    """Which tokens of an output were accepted drafts.

    Args:
        accepts: each step's accepted drafts, in order.
        n_tokens: the output's length (the steps' tokens cut at ``max_new_tokens`` or an eos).

    Returns:
        ``n_tokens`` marks: ``True`` where a token is an accepted draft, ``False`` where the
        target wrote it (the first token, from the prefill, and each step's last).

    Raises:
        ValueError: for a negative count, or steps that commit fewer tokens than ``n_tokens``.
    """
    if any(a < 0 for a in accepts):
        raise ValueError(f"accepted counts must be >= 0, got {accepts}")
    marks = [False]  # the prefill's token
    for a in accepts:
        marks += [True] * a + [False]
    if len(marks) < n_tokens:
        raise ValueError(f"{len(accepts)} steps commit {len(marks)} tokens, fewer than the output's {n_tokens}")
    return marks[:n_tokens]


def token_pieces(decode, ids: list[int]) -> list[str]:
    """The text of ``ids`` (``decode(ids) -> str``) cut at token boundaries: piece ``i`` is the
    whole characters token ``i`` completes (a byte-level token may end inside a character, whose
    bytes decode to U+FFFD until the token that completes it); the pieces join to ``decode(ids)``.
    It decodes every prefix: meant for the few thousand tokens a terminal shows."""
    full, pieces, end = decode(ids), [], 0
    for i in range(len(ids)):
        prefix = decode(ids[: i + 1]).rstrip("\ufffd")  # a character cut at the end is not text yet
        new_end = max(end, len(prefix)) if full.startswith(prefix) else end
        pieces.append(full[end:new_end])
        end = new_end
    pieces[-1:] = [pieces[-1] + full[end:]] if pieces else []  # ids that end inside a character
    return pieces


def loop_functions(loop: str):
    """``(dense, speculative)`` generators of ``loop``: wmtp/decode.py's (``"eager"``) or
    wmtp/static_decode.py's in CUDA graphs (``"graph"``, wmtp/bench_common.py's ``loop_generators``).

    Raises:
        ValueError: for another loop.
    """
    if loop == "eager":
        return greedy_generate, speculative_generate
    if loop == "graph":
        from .bench_common import loop_generators

        return loop_generators(loop)
    raise ValueError(f"loop must be 'eager' or 'graph', got {loop!r}")


@dataclass(frozen=True)
class Generation:
    """One generation: the new tokens, which were accepted drafts, the run's counters, and whether
    the tokens equal dense greedy decoding's (``None``: not checked)."""

    ids: torch.Tensor  # (N,) the new tokens
    drafted: list[bool]  # (N,) True: an accepted draft of the head
    stats: SpecStats
    seconds: float  # the speculative run's wall clock, prefill included
    dense_equal: bool | None


@torch.no_grad()
def generate(target: TargetLM, head: MTPHead, prompt_ids: torch.Tensor, max_new_tokens: int, depth: int,
             n_sink: int | None = None, window: int | None = None, impl: str = "auto", check: bool = True,
             eos_id: int | None = None, reference: torch.Tensor | None = None, loop: str = "eager",
             gate: int | None = None, on_step: Callable[[int], object] | None = None) -> Generation:
    """Greedy speculative decoding with each new token marked as an accepted draft or the target's.

    Args:
        target, head, prompt_ids, max_new_tokens, n_sink, window, impl, eos_id, gate: as
            ``speculative_generate``'s (``window=None``: the native draft, the whole context).
        depth: drafts a step, a positive int (a fixed depth: a depth policy is refused, since the
            marks are recorded through a ``FixedDepth``).
        check: compare the tokens with dense greedy decoding's: ``reference`` if given (the tokens of
            ``greedy_generate`` for the same arguments, run once for many key sets), else a run of it.
        loop: ``"eager"`` (wmtp/decode.py) or ``"graph"`` (wmtp/static_decode.py's loops in CUDA
            graphs, whose ``SpecStats`` times are device times; CUDA and Triton only).
        on_step: called after each decode step with the number of tokens it committed (its accepted
            drafts and the target's token; the last step's may pass ``max_new_tokens`` or an eos), e.g. to
            advance a progress bar. The prefill's first token is not a step's.

    Returns:
        A ``Generation``: the new tokens, their marks (``drafted_marks``), the run's counters, its
        seconds and, with ``check``, whether the tokens equal dense greedy decoding's.

    Raises:
        ValueError: as ``speculative_generate`` (a bad depth, key set or prompt).
    """
    dense_loop, spec_loop = loop_functions(loop)
    recorder = _Recorder(depth, on_step)
    t0 = time.perf_counter()
    ids, stats = spec_loop(target, head, prompt_ids, max_new_tokens, recorder, n_sink, window, impl=impl, eos_id=eos_id,
                           gate=gate)
    seconds = time.perf_counter() - t0
    if check and reference is None:
        reference = dense_loop(target, prompt_ids, max_new_tokens, impl=impl, eos_id=eos_id)
    dense_equal = torch.equal(ids, reference) if check else None
    return Generation(ids, drafted_marks(recorder.accepts, ids.numel()), stats, seconds, dense_equal)


def styled_text(pieces: list[str], drafted: list[bool], prompt_text: str = ""):
    """A rich ``Text``: ``prompt_text`` dim, then each piece, bold green where it is an accepted draft."""
    from rich.text import Text

    text = Text(prompt_text, style="dim")
    for piece, mark in zip(pieces, drafted, strict=True):
        text.append(piece, style=DRAFT_STYLE if mark else None)
    return text
