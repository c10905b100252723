"""Benchmarks: draft-attention cost against context length, side by side per key set.

The paper's draft-KV tax (arXiv 2607.21535, Sec. 1 and 4) is the time the draft head's attention
spends reading the whole context for every drafted token. ``bench_draft_attention`` times one
draft query (``q_len`` 1) over a cache of ``context`` keys with each key set, all in one run,
and reports medians and ratios. Timing uses wall-clock with device synchronisation; figures come
from here (or ``wmtp bench``), never from timed assertions in tests. ``time_call`` is the plain
wall-clock timing; the CUDA timings of ``wmtp bench attention`` live in wmtp/bench_timing.py.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from .attention import attention
from .config import KeySetConfig, ModelConfig
from .device import check_dtype, synchronize
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


def bench_draft_attention(model: ModelConfig, contexts: tuple[int, ...], keysets: tuple[KeySetConfig, ...],
                          *, q_len: int = 1, repeats: int = 50, dtype: torch.dtype = torch.float32,
                          device: torch.device | str = "cpu", impl: str = "auto", seed: int = 0) -> list[dict]:
    """Time the draft head's attention (its shapes: ``Hq``, ``Hkv``, ``head_dim``) per context and key set.

    Returns:
        One row per (context, key set): keys read per query, median and all times in seconds,
        and ``time_ratio_vs_native`` (native median over this median: how many times faster).

    Raises:
        ValueError: for float64 on Apple MPS, which has no float64.
    """
    device = torch.device(device)
    check_dtype(device, dtype)
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
