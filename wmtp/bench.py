"""Benchmarks: draft-attention cost against context length, side by side per key set.

The paper's draft-KV tax (arXiv 2607.21535, Sec. 1 and 4) is the time the draft head's attention
spends reading the whole context for every drafted token. ``bench_draft_attention`` times one
draft query (``q_len`` 1) over a cache of ``context`` keys with each key set, all in one run,
and reports medians and ratios. Timing uses wall-clock with device synchronisation; figures come
from here (or ``wmtp bench``), never from timed assertions in tests. ``time_call`` is the plain
wall-clock timing; the CUDA timings of ``wmtp bench attention`` live in wmtp/bench_timing.py.
``attention_cli`` is the ``wmtp bench attention`` command: the CUDA kernel sweep
(wmtp/bench_attention.py), or elsewhere these draft queries, as a table (``attention_table``);
``check_kv_fits`` first refuses contexts whose keys and values the device cannot hold.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

from .attention import attention
from .config import KeySetConfig, ModelConfig
from .device import check_dtype, synchronize
from .keyset import key_count
from .policy import gated_key_set


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

    def draw(*shape: int) -> torch.Tensor:  # on the CPU by name (a CPU generator draws there only), then moved
        return torch.randn(*shape, generator=g, device="cpu").to(device, dtype)

    rows = []
    for S in contexts:
        q = draw(1, model.n_heads, q_len, model.head_dim)  # (1, Hq, Lq, D)
        k = draw(1, model.n_kv_heads, S, model.head_dim)  # (1, Hkv, S, D)
        v = draw(1, model.n_kv_heads, S, model.head_dim)  # (1, Hkv, S, D)
        q_pos = torch.arange(S - q_len, S, device=device)
        native = None
        for ks in sorted(keysets, key=lambda c: c.window is not None):  # native first: the baseline
            sink, win = gated_key_set(S, ks.n_sink, ks.window, ks.gate)  # a decode step's key set at context S
            times = time_call(lambda: attention(q, k, v, q_pos, sink, win, impl=impl), device, repeats)
            med = statistics.median(times)
            native = med if ks.window is None else native
            rows.append({"context": S, "keyset": ks.label, "n_sink": ks.n_sink, "window": ks.window, "gate": ks.gate,
                         "keys_read": key_count(S - 1, sink, win), "median_s": med, "times_s": times,
                         "time_ratio_vs_native": (native / med) if native else None})
    return rows


def device_memory_bytes(device: torch.device) -> int | None:
    """The device's memory in bytes: a CUDA GPU's total (``torch.cuda.mem_get_info``), else the
    host's physical memory (the CPU's, which Apple MPS shares); ``None`` where the OS does not say."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no os.sysconf (Windows), or no such name
        return None


def check_kv_fits(contexts: tuple[int, ...], batch: int, kv_shapes: tuple[tuple[int, int], ...], itemsize: int,
                  paged: bool, memory_bytes: int | None) -> None:
    """Refuse contexts whose keys and values cannot be held, before anything is allocated: the
    largest cell's ``k`` and ``v``, ``(batch, Hkv, S, D)`` each at the largest ``S`` and the largest
    ``Hkv * D`` of ``kv_shapes`` (``(Hkv, D)`` pairs), and with ``paged`` their paged copies too
    (the sweep's ``paginate_cell`` keeps them beside ``k`` and ``v``), against ``memory_bytes``
    (``None``: unknown, nothing checked). A lower bound of what the bench holds at once, so a context
    it refuses cannot run in the device's memory; unchecked, a CPU run was killed for memory
    (exit 137, no message) and a GPU sweep filled its rows with allocation errors.

    Raises:
        ValueError: naming ``--contexts``, the GiB needed and the GiB the device has.
    """
    S, rows = max(contexts), max(hkv * d for hkv, d in kv_shapes)
    need = (4 if paged else 2) * batch * S * rows * itemsize
    if memory_bytes is not None and need > memory_bytes:
        at = "" if batch == 1 else f" at --batch {batch}"
        raise ValueError(f"--contexts {S}{at} needs about {need / 2**30:.1f} GiB for k and v"
                         f"{' and their paged copies' if paged else ''}, more than the {memory_bytes / 2**30:.1f} "
                         "GiB this device has")


def attention_table(rows: list[dict]):
    """A rich table of ``bench_draft_attention``'s rows (also reproduce's ``draft_attention``)."""
    from rich.table import Table

    table = Table(title="Draft attention alone (one query), median of repeats")
    for col in ("context", "key set", "keys read", "median ms", "times faster than native"):
        table.add_column(col, justify="right")
    for r in rows:
        ratio = r["time_ratio_vs_native"]
        table.add_row(str(r["context"]), r["keyset"], str(r["keys_read"]), f"{r['median_s'] * 1e3:.4f}",
                      "-" if r["window"] is None else f"{ratio:.1f}x")
    return table


def attention_cli(args, prog: str, argv: list[str]) -> int:
    """Run ``wmtp bench attention``: the CUDA kernel sweep (wmtp/bench_attention.py), or elsewhere one
    draft query per key set and context, timed side by side."""
    from pathlib import Path

    from rich.console import Console

    from .cli import stdout_console
    from .device import resolve_device
    from .fileio import check_distinct, check_writable
    from .metrics import command_line, environment, write_json

    if any(x is not None and x < 1 for x in (args.repeats, args.rep_ms, args.batch, *(args.contexts or ()))):
        raise ValueError("--repeats, --rep-ms, --batch and --contexts must be positive")
    if args.contexts and len(set(args.contexts)) < len(args.contexts):
        raise ValueError(f"--contexts must each be given once, got {args.contexts}")
    device = resolve_device(args.device)
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if device.type == "cuda":  # the kernel sweep (wmtp/bench_attention.py)
        if args.repeats is not None:
            raise ValueError("--repeats times one draft query off CUDA; the kernel sweep measures for --rep-ms")
        from . import bench_attention as ba
        from . import bench_report

        slug = "h200" if "H200" in torch.cuda.get_device_name(device) else "cuda"
        batch = 1 if args.batch is None else args.batch
        contexts, methods = tuple(args.contexts or ba.CONTEXTS), tuple(args.methods or ba.METHODS)
        check_kv_fits(contexts, batch, tuple((hkv, d) for _, hkv, d in ba.SHAPES), getattr(torch, dtype).itemsize,
                      any("paged" in m for m in methods), device_memory_bytes(device))
        out = args.out or Path("metrics") / f"bench-attention-{slug}{'' if batch == 1 else f'-b{batch}'}.json"
        png = args.plot or out.with_suffix(".png")
        check_writable(out, "--out")
        check_writable(png, "--plot")
        if png.suffix.lower() != ".png":
            raise ValueError(f"--plot {png}: the plot is a PNG, name it .png")
        check_distinct(out, png, "--out", "--plot")
        rep_ms = 100 if args.rep_ms is None else args.rep_ms
        command = command_line(prog, ["bench", "attention", "--device", args.device, "--dtype", dtype, "--rep-ms",
                                      str(rep_ms), "--batch", str(batch), "--contexts", *map(str, contexts),
                                      "--methods", *methods, "--out", str(out), "--plot", str(png)])
        result = ba.sweep(device, contexts=contexts, dtype=getattr(torch, dtype), methods=methods, batch=batch,
                          rep_ms=rep_ms, command=command, on_progress=lambda partial: write_json(out, partial))
        Console(width=200).print(bench_report.table(result))
        write_json(out, result)
        err = Console(stderr=True)
        try:
            bench_report.plot(result, png)
            wrote = f"{out} and {png}"
        except Exception as e:  # the JSON is written; a missing matplotlib must not hide it
            wrote = f"{out} (no plot: {type(e).__name__}: {e})"
        for name, bar in result["bars"].items():
            step = bar.get("met_by_step_ms")
            step = "" if step is None else f" (by step_ms: {'met' if step else 'not met'})"
            err.print(f"bar {name}: {'met' if bar['met'] else 'NOT met'}{step}", markup=False, soft_wrap=True)
        if batch != 1:
            err.print(f"bars: the bars (docs/results/gpu-attention.md) are judged at batch 1, not at --batch {batch}",
                      markup=False, soft_wrap=True)
        err.print(f"wrote {wrote}; the sweep took {result['wall_time_s']:.0f} s", markup=False,
                  soft_wrap=True)  # one line on a pipe, however long the path
        return 0
    if args.plot or args.methods or args.rep_ms is not None or args.batch is not None:
        raise ValueError("--plot, --methods, --rep-ms and --batch belong to the kernel sweep, "
                         "which needs --device cuda")
    from .config import get_preset

    preset = get_preset(args.preset)
    contexts = tuple(args.contexts or (1024, 4096, 16384))
    check_kv_fits(contexts, 1, ((preset.model.n_kv_heads, preset.model.head_dim),), getattr(torch, dtype).itemsize,
                  False, device_memory_bytes(device))
    if args.out:
        check_writable(args.out, "--out")
        if args.out.suffix.lower() == ".png":
            raise ValueError(f"--out {args.out}: the metrics file is JSON (`wmtp plot` draws it); name it .json")
    rows = bench_draft_attention(preset.model, contexts, preset.spec.keysets,
                                 repeats=100 if args.repeats is None else args.repeats, dtype=getattr(torch, dtype),
                                 device=device)
    stdout_console().print(attention_table(rows))
    if args.out:  # a metrics file `wmtp plot` draws (plots.plot_draft_attention)
        from .metrics import SCHEMA_VERSION
        from .plots import DRAFT_ATTENTION_KIND

        write_json(args.out, {"schema_version": SCHEMA_VERSION, "kind": DRAFT_ATTENTION_KIND,
                              "command": command_line(prog, argv),
                              "environment": environment(device), "preset": args.preset, "dtype": dtype,
                              "rows": rows})
    return 0
