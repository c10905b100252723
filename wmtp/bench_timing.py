"""CUDA timings of one call, for ``wmtp bench attention`` and scripts/ (arXiv 2607.21535, Sec. 4:
the draft-KV tax is a few microseconds a token, where how a call is timed matters as much as
what it does).

- ``host_ms``: the host's time inside one call (the Python launcher's share);
- ``capture_graph`` and ``graph_replay_ms``: the call captured once in a CUDA graph, its replay
  timed alone (the bench's ``graph_ms``, which pays the replay's own launch);
- ``step_ms``: what the call adds to ONE CUDA graph of other work, after an ``l2_flush`` (the
  bench's ``step_ms``, as a kernel of a decode step captured in one graph runs);
- ``empty_kernels_ms`` / ``graph_floor_ms``: what a timing measures for kernels that do nothing.

docs/results/gpu-attention.md ("Timing a 10 µs kernel") sets the timings side by side.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from .device import capture_graph

STEP_CALLS = 32  # step_ms: calls in one graph (each after a flush)
STEP_REPLAYS = 25  # step_ms: replays of each graph, interleaved; medians


def host_ms(fn: Callable[[], object], device: torch.device, calls: int = 10) -> float:
    """Median host time inside one call of ``fn`` (CUDA), the device idle before it and not waited for
    after. Near a plain-call timing it says that timing is host-bound: the launcher, not the kernel."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize(device)
    return statistics.median(times) * 1e3


def graph_replay_ms(fn: Callable[[], object], timed_ms: Callable) -> float | str:
    """``fn`` captured once in a CUDA graph, its replay timed by ``timed_ms``: the device time of the
    call's kernels with no launcher in the way. An error string if capture fails."""
    try:
        return timed_ms(capture_graph(fn).replay)
    except Exception as e:
        return f"graph capture: {type(e).__name__}: {e}"[:300]


def empty_kernels_ms(device: torch.device, timer: Callable) -> dict[str, float | str]:
    """``timer(fn)`` of one, and of two dependent, one-element kernels: what a timing method measures
    for kernels that do nothing (kernels whose launches overlap, as with programmatic dependent
    launch, are not covered)."""
    x = torch.zeros(1, device=device)  # (1,)
    return {"one_kernel": timer(lambda: x.add_(1)), "two_kernels": timer(lambda: x.add_(1).add_(1))}


def graph_floor_ms(device: torch.device, timed_ms: Callable) -> dict[str, float | str]:
    """``empty_kernels_ms`` under ``graph_replay_ms``: the floor of ``graph_ms``."""
    return empty_kernels_ms(device, lambda fn: graph_replay_ms(fn, timed_ms))


def l2_flush(device: torch.device, nbytes: int = 256 << 20) -> Callable[[], object]:
    """``triton.testing.do_bench``'s flush as a call: zero ``nbytes`` of its own, so that L2 holds
    nothing a timed call reads (and is full of dirty lines). What runs before a call moves its time:
    in a graph, a sum over 256 MB instead of this made an 8-query draft 6-7 us slower, a 256 MB
    ``copy_`` 1.4-1.8 us faster (metrics/experiments/step-flush-h200-exp10.json)."""
    buf = torch.empty(nbytes, dtype=torch.int8, device=device)  # (nbytes,)
    return buf.zero_


def _replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    """One replay of ``graph`` timed by CUDA events around it, in ms (waits for it to finish)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def step_ms(fn: Callable[[], object], flush: Callable[[], object], calls: int = STEP_CALLS,
            replays: int = STEP_REPLAYS) -> float | str:
    """What ``fn`` adds to a CUDA graph of other work: ONE graph of ``calls`` x (``flush``, ``fn``)
    and one of ``calls`` x ``flush``, each replayed once untimed, then ``replays`` times in turn
    (the order alternating), each replay timed by CUDA events; the difference of their medians per
    call. An error string if capture or replay fails.

    With ``l2_flush`` it differs from ``graph_replay_ms`` under ``do_bench`` mainly by the replay's
    own launch, which a kernel of a decode step captured in one graph does not pay (an empty
    kernel: 4.7 us as ``graph_ms``, 1.6 us as ``step_ms`` on an H200). Not only by it: the
    dirty lines the call's reads write back are lines the next flush need not write, a credit
    ``do_bench`` never gives."""
    def both():
        for _ in range(calls):
            flush()
            fn()

    def only():
        for _ in range(calls):
            flush()

    try:
        graphs = {"both": capture_graph(both), "only": capture_graph(only)}
        for g in graphs.values():
            g.replay()  # untimed: the first replay uploads the graph
        times = {"both": [], "only": []}
        for i in range(replays):  # interleaved, in alternating order, so that drift hits both alike
            for name in ("both", "only") if i % 2 == 0 else ("only", "both"):
                times[name].append(_replay_ms(graphs[name]))
        return (statistics.median(times["both"]) - statistics.median(times["only"])) / calls
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:300]
