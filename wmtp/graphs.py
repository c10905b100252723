"""CUDA-graph plumbing for the device-resident loops of wmtp/static_decode.py (and static_lockstep.py,
static_batched.py): whether to capture, the prompt's device made current, a step captured (or not)
into a graph, a speculative step's two phases captured per shape (``Phases``), and the clock that
times the steps (arXiv 2607.21535, Sec. 4: the draft-KV tax is device time, which graphs expose).

NOTE [One graph pool]: a speculative run captures up to ``K (K + 1)`` draft-phase graphs (twice
that with a context gate: one per key set) and ``K`` verify-phase graphs (NOTE [Static depths] in
wmtp/static_decode.py). Each captured into a memory
pool of its own keeps its temporaries (logits, the attention's split-K partials) for as long as
it lives; ``graph_pool`` gives one pool for all of a run's captures, so they reuse one another's.
That is safe whatever order the graphs replay in: a phase's results that outlive it are copied
into the loop's state and caches, allocated before any capture, and what a phase allocates inside
its graph is dead when the phase ends, so another phase may overwrite it. (PyTorch's caution
about shared pools, "replay in capture order", guards against a graph's *output* living in the
pool; these graphs have none.) The H200 measurement: docs/results/gpu-decode.md ("A run's
memory").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

from .device import capture_graph, synchronize

__all__ = ["Clock", "Phases", "graph_pool", "on_device_of", "runner", "use_graph"]


def graph_pool():
    """One memory pool for a run's CUDA graphs (NOTE [One graph pool])."""
    return torch.cuda.graph_pool_handle()


def use_graph(cuda_graph: bool | None, device: torch.device, impl: str) -> bool:
    """``cuda_graph=None``: capture when the device is CUDA and the impl Triton (the reference
    attention reads query positions on the host, which a graph cannot)."""
    if cuda_graph is None:
        return device.type == "cuda" and impl == "triton"
    if not isinstance(cuda_graph, bool):
        raise ValueError(f"cuda_graph must be True, False or None, got {cuda_graph!r}")
    if cuda_graph and (device.type != "cuda" or impl != "triton"):
        raise ValueError(f"cuda_graph=True needs a CUDA device and impl 'triton' (the reference attention "
                         f"reads query positions on the host); got device {device.type}, impl {impl!r}")
    return cuda_graph


def on_device_of(prompt_ids) -> contextlib.AbstractContextManager:
    """The prompt's CUDA device made current, so that capture streams, graph replays and timing events
    are that device's, not device 0's; on other devices (or a bad prompt, refused later), nothing."""
    if isinstance(prompt_ids, torch.Tensor) and prompt_ids.device.type == "cuda":
        return torch.cuda.device(prompt_ids.device)
    return contextlib.nullcontext()


def runner(step: Callable[[], None], state: tuple[torch.Tensor, ...], graph: bool, pool=None) -> Callable[[], None]:
    """``step`` itself, or its CUDA graph's replay, captured into memory pool ``pool`` (NOTE [One
    graph pool]; ``None``: a pool of its own). Capturing runs the step once (a warm-up: Triton
    compiles), so ``state`` is restored afterwards; the cache entries it wrote are rewritten, the
    same, by the first real step before anything reads them."""
    if not graph:
        return step
    saved = [t.clone() for t in state]
    replay = capture_graph(step, pool).replay
    for t, s in zip(state, saved):
        t.copy_(s)
    return replay


class Phases:
    """A speculative step's two phases as the static loops run them (wmtp/static_decode.py,
    static_lockstep.py, static_batched.py): the draft phase captured once per key (NOTE [Static
    depths]: its extend rows, depth and, with a context gate, key set), the verify phase once per
    depth, into one graph pool, each step's pair run between three marks of ``clock``."""

    def __init__(self, draft_phase: Callable[..., None], verify_phase: Callable[[int], None],
                 state: tuple[torch.Tensor, ...], graph: bool, clock: Clock) -> None:
        self.draft_phase, self.verify_phase, self.state, self.graph, self.clock = (draft_phase, verify_phase, state,
                                                                                   graph, clock)
        self.pool = graph_pool() if graph else None  # NOTE [One graph pool]
        self.drafts: dict[tuple, Callable[[], None]] = {}
        self.verifies: dict[int, Callable[[], None]] = {}

    def step(self, draft_key: tuple, k: int) -> None:
        """``draft_phase(*draft_key)``, then ``verify_phase(k)``. In this order: a new depth is a new
        draft key, so the draft phase's capture warm-up writes the step's drafts and positions before
        the verify phase's warm-up reads them (``runner``: what a warm-up writes to the caches, the
        real step rewrites the same)."""
        if draft_key not in self.drafts:
            self.drafts[draft_key] = runner(lambda: self.draft_phase(*draft_key), (), self.graph, self.pool)
        if k not in self.verifies:
            self.verifies[k] = runner(lambda: self.verify_phase(k), self.state, self.graph, self.pool)
        self.clock.mark()
        self.drafts[draft_key]()
        self.clock.mark()
        self.verifies[k]()
        self.clock.mark()


class Clock:
    """Seconds between marks: CUDA events on CUDA (the host does not wait), else wall clock after a
    synchronize. ``spans`` needs the marked work finished (on CUDA, after any read of the device).

    On CUDA a span that starts right after the host read the device (the speculative step's first,
    the draft phase) also holds the host's launch of the next replay, a few microseconds, while the
    device waits for it; the spans after it start with work already queued."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.marks = device, []

    def mark(self) -> None:
        if self.device.type == "cuda":
            self.marks.append(torch.cuda.Event(enable_timing=True))
            self.marks[-1].record()
        else:
            synchronize(self.device)
            self.marks.append(time.perf_counter())

    def spans(self) -> list[float]:
        """Seconds between consecutive marks, which it then forgets."""
        m, self.marks = self.marks, []
        if self.device.type == "cuda":
            synchronize(self.device)
            return [a.elapsed_time(b) / 1e3 for a, b in zip(m, m[1:])]
        return [b - a for a, b in zip(m, m[1:])]
