"""Microseconds a call of a function captured ``calls`` times in one CUDA graph: the timing of
experiments 28, 29 and 31 (each passes the replays, rounds and warm-up replays it ran with)."""

import statistics

import torch

from wmtp.device import capture_graph


def us_per_call(fn, calls: int, reps: int, rounds: int, warm: int) -> float:
    """``fn`` captured ``calls`` times in one graph, replayed ``warm`` times, then ``rounds`` rounds of
    ``reps`` replays timed with CUDA events: the median round's microseconds a call."""
    graph = capture_graph(lambda: [fn() for _ in range(calls)])
    for _ in range(warm):
        graph.replay()
    out = []
    for _ in range(rounds):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        torch.cuda.synchronize()
        ev[0].record()
        for _ in range(reps):
            graph.replay()
        ev[1].record()
        torch.cuda.synchronize()
        out.append(ev[0].elapsed_time(ev[1]) / reps / calls * 1e3)
    return statistics.median(out)
