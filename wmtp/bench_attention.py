"""Attention kernels side by side on one GPU, against the HBM floor: the draft-KV tax, measured.

The paper's draft-KV tax (arXiv 2607.21535, Sec. 1 and 4): a native MTP draft head reads the whole
KV cache for every drafted token, so its attention time grows with the context ``S``; a
Windowed-MTP draft reads ``n_sink + window`` keys whatever ``S`` is. ``sweep`` times, in one run on
the same inputs, the methods of wmtp/bench_methods.py (wmtp's Triton kernels: windowed draft, full
verify, contiguous and paged cache; SDPA over the full cache, gather-then-SDPA, SDPA over a ready
compact buffer, FlexAttention with a block mask) and sets each time against the HBM floor (the
bytes a method must move over the measured copy bandwidth). ``bars``, ``table`` and ``plot``
(wmtp/bench_report.py) check the bars and render a result. Figures come from here, never from timed assertions
in tests; the timings are wmtp/bench_timing.py's, and ``CAVEATS`` (NOTE [Timing] in
wmtp/bench_report.py), written into every result, says what they include.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable

import torch

from .bench import time_call
from .bench_methods import BUILDERS, METHODS, Cell, paginate_cell, sdpa, window_keys
from .bench_report import CAVEATS, PAGE_SIZE, STEP_MAX_MS, bars, method_bytes
from .bench_timing import (
    STEP_CALLS,
    STEP_REPLAYS,
    empty_kernels_ms,
    graph_floor_ms,
    graph_replay_ms,
    host_ms,
    l2_flush,
    step_ms,
)
from .keyset import check_key_set_args
from .metrics import environment

CONTEXTS = (16384, 131072, 524288, 1048576)  # S
SHAPES = ((16, 2, 256), (32, 8, 128))  # (Hq, Hkv, D)
Q_LENS = (1, 8)  # 1: one draft query; 8: a verify chunk (or a batch of draft positions)
ERROR_TAIL_LINES = 3  # a failed call's record keeps its message's first line and this many last ones


def _error_text(e: Exception) -> str:
    """One line for a failed call: the exception's type, its message's first line and, for a message
    of many lines (a compiler's traceback from a subprocess), its last lines, where the cause is."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    head = lines[0][:200] if lines else ""
    tail = " | ".join(lines[1:][-ERROR_TAIL_LINES:])[-400:]
    return type(e).__name__ + (f": {head}" if head else "") + (f" ... {tail}" if tail else "")


def _with(row: dict, key: str, value: float | str) -> None:
    """``row[key] = value`` for a time; an error string goes to the row's note instead."""
    if isinstance(value, float):
        row[key] = value
    else:
        row["note"] = "; ".join(filter(None, [row["note"], f"{key}: {value}"]))


def _measure(name: str, c: Cell, row: dict, timed_ms: Callable, step: Callable | None,
             ref: torch.Tensor | None) -> float | str | None:
    """Time method ``name`` on cell ``c`` into ``row`` (``step``: ``step_ms`` with the sweep's flush, CUDA
    only); return max |out - ref| (fp32), or the error string. A failure fills ``row["error"]`` and
    returns: one method's failure is data, not the end of the sweep."""
    try:
        t0 = time.perf_counter()
        fn = BUILDERS[name](c)
        row["setup_s"], row["note"] = time.perf_counter() - t0, getattr(fn, "note", None) or None
        err = None if ref is None else (fn().float() - ref).abs().max().item()
        ms = timed_ms(fn)
        row["median_ms"], row["pct_of_floor"] = ms, row["floor_ms"] / ms * 100
        if c.q.device.type == "cuda":
            row["host_ms"] = host_ms(fn, c.q.device)
            graph = graph_replay_ms(fn, timed_ms)
            _with(row, "graph_ms", graph)
            stepped = isinstance(graph, float) and graph <= STEP_MAX_MS  # NOTE [Timing]: step_ms's gate
            if stepped:
                _with(row, "step_ms", step(fn))
            if name == "triton_window":
                from .bench_read import read_floor_ms

                _with(row, "read_floor_ms", read_floor_ms(c.k, c.v, c.q_pos, c.n_sink, c.window,
                                                          lambda f: graph_replay_ms(f, timed_ms)))
                if stepped:
                    _with(row, "step_read_floor_ms", read_floor_ms(c.k, c.v, c.q_pos, c.n_sink, c.window, step))
        return err
    except Exception as e:
        row["error"] = _error_text(e)
        return row["error"]


def sweep(device: torch.device | str, contexts=CONTEXTS, shapes=SHAPES, q_lens=Q_LENS,
          dtype: torch.dtype = torch.bfloat16, n_sink: int = 64, window: int = 4096, methods=METHODS, *,
          batch: int = 1, repeats: int = 5, warmup_ms: int = 25, rep_ms: int = 100, seed: int = 0,
          command: str | None = None, on_progress: Callable[[dict], object] | None = None) -> dict:
    """Time every method on every (S, shape, q_len), queries at positions ``S-q_len .. S-1``.

    Inputs are random normal from one seeded generator on ``device``, drawn once per (S, shape) and
    shared by every method and q_len. A method that fails records its error string in its row.
    Every row of a batch has ``S`` keys and the same positions; the bars are judged at batch
    1 only (``bars`` is empty for another batch).

    Args:
        device: CUDA times with ``triton.testing.do_bench``; elsewhere with ``wmtp.bench.time_call``.
        contexts, shapes, q_lens: cache lengths ``S``; ``(Hq, Hkv, D)`` head shapes; queries per call.
        dtype: of q, k and v.
        n_sink, window: the key set (wmtp/keyset.py) of the window methods.
        methods: names from ``METHODS``.
        batch: sequences per call (``B`` of q, k and v); bytes and floors count every row.
        repeats: timed calls per cell off CUDA (median reported).
        warmup_ms, rep_ms: ``do_bench`` warm-up and measuring time per cell on CUDA, in ms.
        seed, command: the generator's seed; the command line, recorded in the result.
        on_progress: called with the result so far (``"complete": False``) after each (S, shape),
            so that a sweep stopped early keeps what it measured.

    Returns:
        The metrics dict: settings, ``environment``, ``copy_bandwidth_gbs``, ``correctness`` (max-abs error of
        each method against SDPA in fp32, first shape, smallest S), ``caveats``, ``rows``, ``bars``.
    """
    device, n_sink = torch.device(device), check_key_set_args(n_sink, window)
    bad = [m for m in methods if m not in BUILDERS]
    if window is None or bad or not methods:
        raise ValueError(f"need a window (got {window}) and methods from {', '.join(BUILDERS)} (unknown: {bad})")
    if not contexts or not shapes or not q_lens or min(q_lens) < 1 or min(contexts) < max(q_lens):
        raise ValueError(f"need contexts >= every q_len >= 1; got contexts {contexts}, q_lens {q_lens}")
    if any(len(s) != 3 or min(s) < 1 or s[0] % s[1] for s in shapes) or min(repeats, warmup_ms, rep_ms) < 1:
        raise ValueError(f"need shapes (Hq, Hkv, D) with Hq % Hkv == 0 (got {shapes}) and positive repeats, "
                         f"warmup_ms, rep_ms (got {repeats}, {warmup_ms}, {rep_ms})")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"need a batch of at least one sequence, got {batch!r}")
    if device.type == "cuda" and device.index not in (None, torch.cuda.current_device()):
        with torch.cuda.device(device):  # graph capture, streams and do_bench's L2 flush use the current GPU
            return sweep(device, contexts, shapes, q_lens, dtype, n_sink, window, methods, batch=batch, repeats=repeats,
                         warmup_ms=warmup_ms, rep_ms=rep_ms, seed=seed, command=command, on_progress=on_progress)
    t_start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(seed)

    def timed_ms(fn: Callable[[], object]) -> float:
        if device.type == "cuda":
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
        return statistics.median(time_call(fn, device, repeats, warmup=1)) * 1e3

    n = 2**30 if device.type == "cuda" else 2**23  # bf16 elements: 2 GiB on CUDA, 16 MiB elsewhere
    src = torch.empty(n, device=device, dtype=torch.bfloat16).normal_(generator=gen)
    dst = torch.empty_like(src)
    bandwidth = 4 * n / (timed_ms(lambda s=src, d=dst: d.copy_(s)) * 1e-3)  # bytes/s: 2 read + 2 written per element
    del src, dst
    floor = graph_floor_ms(device, timed_ms) if device.type == "cuda" else None  # NOTE [Timing]
    step = functools.partial(step_ms, flush=l2_flush(device)) if device.type == "cuda" else None
    step_floor = empty_kernels_ms(device, step) if step is not None else None

    rows, correctness = [], {}

    def result(complete: bool) -> dict:
        return {"command": command, "complete": complete, "environment": environment(device),
                "dtype": str(dtype).removeprefix("torch."), "n_sink": n_sink, "window": window, "page_size": PAGE_SIZE,
                "batch": batch, "contexts": list(contexts), "shapes": [list(s) for s in shapes], "q_lens": list(q_lens),
                "methods": list(methods),
                "timing": {"tool": "triton.testing.do_bench", "warmup_ms": warmup_ms, "rep_ms": rep_ms, "median": True,
                           "graph_ms": "the call captured in a CUDA graph, replay timed the same way",
                           "step_ms": f"{STEP_CALLS} x (flush, call) in one CUDA graph minus {STEP_CALLS} x flush, "
                                      f"per call, medians of {STEP_REPLAYS} replays each, for calls whose graph_ms "
                                      f"is at most {STEP_MAX_MS} ms"}
                if device.type == "cuda" else {"tool": "wmtp.bench.time_call", "repeats": repeats, "median": True},
                "copy_bandwidth_gbs": bandwidth / 1e9, "graph_floor_ms": floor,
                "step_floor_ms": step_floor, "correctness": dict(correctness),
                "caveats": CAVEATS,
                "rows": list(rows), "bars": bars(rows) if batch == 1 else {},  # the bars: batch 1
                "wall_time_s": time.perf_counter() - t_start}

    import torch._dynamo.config as dynamo  # a scoped patch: FlexAttention compiles per shape, never falls back

    limit = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
    with dynamo.patch(**{limit: max(64, getattr(dynamo, limit))}):
        for S in contexts:
            for Hq, Hkv, D in shapes:
                k = v = pages = c = None
                try:
                    k = torch.randn(batch, Hkv, S, D, generator=gen, device=device, dtype=dtype)  # (B, Hkv, S, D)
                    v = torch.randn(batch, Hkv, S, D, generator=gen, device=device, dtype=dtype)  # (B, Hkv, S, D)
                    pages, input_error = functools.cache(functools.partial(paginate_cell, k, v, gen)), None
                except Exception as e:  # e.g. out of memory: every row of this (S, shape) says so
                    input_error = f"inputs: {_error_text(e)}"
                for q_len in q_lens:
                    c = None if input_error else Cell(k, v, pages, Hq, q_len, n_sink, window, gen)
                    refs, errs = {}, {}
                    if c is not None and (S, (Hq, Hkv, D)) == (min(contexts), tuple(shapes[0])):
                        guard = correctness[f"q_len={q_len}"] = {"S": S, "Hq": Hq, "Hkv": Hkv, "D": D}
                        try:  # the correctness guard's references: SDPA in fp32 over the full or window set
                            refs = {w: sdpa(c.q.float(), *(x.float() for x in (c.compact() if w else (k, v))),
                                             c.mask(w), c.gqa)() for w in (False, True)}
                            guard.update(max_abs_err=errs, ref_max_abs={"full": refs[False].abs().max().item(),
                                                                        "window": refs[True].abs().max().item()})
                        except Exception as e:
                            guard["error"], refs = _error_text(e), {}
                    sink_hi, rec_lo = window_keys(S, q_len, n_sink, window)
                    for name in methods:
                        windowed = "window" in name
                        keys = sink_hi + S - rec_lo if windowed else S
                        nbytes = method_bytes(name, keys, Hq, Hkv, D, q_len, dtype.itemsize, batch)
                        row = {"method": name, "batch": batch, "S": S, "Hq": Hq, "Hkv": Hkv, "D": D, "q_len": q_len,
                               "dtype": str(dtype).removeprefix("torch."), "keys_read": keys, "median_ms": None,
                               "bytes": nbytes, "floor_ms": nbytes / bandwidth * 1e3, "pct_of_floor": None,
                               "host_ms": None, "graph_ms": None, "step_ms": None, "read_floor_ms": None,
                               "step_read_floor_ms": None, "setup_s": None, "note": None,
                               "error": input_error}
                        if c is not None:
                            err = _measure(name, c, row, timed_ms, step, refs.get(windowed))
                            errs.update({name: err} if refs else {})
                        rows.append(row)
                del k, v, pages, c, refs
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if on_progress is not None:
                    on_progress(result(complete=False))
    return result(complete=True)

