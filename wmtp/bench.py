"""Benchmarks: draft-attention cost against context length, side by side per key set.

The paper's draft-KV tax (arXiv 2607.21535, Sec. 1 and 4) is the time the draft head's attention
spends reading the whole context for every drafted token. ``bench_draft_attention`` times one
draft query (``q_len`` 1) over a cache of ``context`` keys with each key set, all in one run,
and reports medians and ratios. Timing uses wall-clock with device synchronisation; figures come
from here (or ``wmtp bench``), never from timed assertions in tests. The CUDA timing helpers of
``wmtp bench attention`` and scripts/ live here too: ``host_ms`` (the launcher's share of a call),
``capture_graph``, ``graph_replay_ms`` (a call's kernels replayed from a CUDA graph), ``step_ms``
(what a call adds to a CUDA graph of other work, after an ``l2_flush``) and ``empty_kernels_ms`` /
``graph_floor_ms`` (what a timing measures for kernels that do nothing).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from .attention import attention
from .config import KeySetConfig, ModelConfig
from .device import synchronize
from .keyset import key_count


def time_call(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 3) -> list[float]:
    """Seconds per call of ``fn``, ``repeats`` times after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


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


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """``fn`` run once on a side stream (compiles, allocator warm-up), then captured in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as capture requires
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


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
    nothing a timed call reads. What runs before a call moves its time: in a graph, a sum over 256 MB
    instead of this made an 8-query draft 6-7 us slower, a 256 MB copy_ 1.4-1.8 us faster
    (metrics/experiments/step-flush-h200-exp10.json); keeping do_bench's flush makes ``step_ms`` and
    ``graph_ms`` differ in one thing only, the replay's own launch."""
    buf = torch.empty(nbytes, dtype=torch.int8, device=device)  # (nbytes,)
    return buf.zero_


def _replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def step_ms(fn: Callable[[], object], flush: Callable[[], object], calls: int = 32, replays: int = 25) -> float | str:
    """What ``fn`` adds to a CUDA graph of other work, L2 flushed before it: ONE graph of ``calls`` x
    (``flush``, ``fn``) and one of ``calls`` x ``flush``, replayed in turn ``replays`` times, each replay
    timed by CUDA events; the difference of their medians per call. As in a decode step captured in
    one graph, the call pays no graph launch of its own (``graph_ms`` does: 4.5 us for an empty
    kernel on an H200) and follows other kernels. An error string if capture fails."""
    def both():
        for _ in range(calls):
            flush()
            fn()

    def only():
        for _ in range(calls):
            flush()

    try:
        g_both, g_only = capture_graph(both), capture_graph(only)
        t_both, t_only = [], []
        for _ in range(replays):  # interleaved, so that drift hits both alike
            t_both.append(_replay_ms(g_both))
            t_only.append(_replay_ms(g_only))
        return (statistics.median(t_both) - statistics.median(t_only)) / calls
    except Exception as e:
        return f"step: {type(e).__name__}: {e}"[:300]


def bench_draft_attention(model: ModelConfig, contexts: tuple[int, ...], keysets: tuple[KeySetConfig, ...],
                          *, q_len: int = 1, repeats: int = 50, dtype: torch.dtype = torch.float32,
                          device: torch.device | str = "cpu", impl: str = "auto", seed: int = 0) -> list[dict]:
    """Time the draft head's attention (its shapes: ``Hq``, ``Hkv``, ``head_dim``) per context and key set.

    Returns:
        One row per (context, key set): keys read per query, median and all times in seconds,
        and ``time_ratio_vs_native`` (native median over this median: how many times faster).
    """
    device = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for S in contexts:
        q = torch.randn(1, model.n_heads, q_len, model.head_dim, generator=g).to(device, dtype)  # (1, Hq, Lq, D)
        k = torch.randn(1, model.n_kv_heads, S, model.head_dim, generator=g).to(device, dtype)  # (1, Hkv, S, D)
        v = torch.randn(1, model.n_kv_heads, S, model.head_dim, generator=g).to(device, dtype)  # (1, Hkv, S, D)
        q_pos = torch.arange(S - q_len, S, device=device)
        native = None
        for ks in sorted(keysets, key=lambda c: c.window is not None):  # native first: the baseline
            times = time_call(lambda: attention(q, k, v, q_pos, ks.n_sink, ks.window, impl=impl), device, repeats)
            med = statistics.median(times)
            native = med if ks.window is None else native
            rows.append({"context": S, "keyset": ks.label, "n_sink": ks.n_sink, "window": ks.window,
                         "keys_read": key_count(S - 1, ks.n_sink, ks.window), "median_s": med, "times_s": times,
                         "time_ratio_vs_native": (native / med) if native else None})
    return rows
