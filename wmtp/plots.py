"""Plots of the metrics JSON that ``wmtp reproduce`` and ``wmtp bench`` (attention, decode, depth,
sampling, positions, batch) write.

``render(json_path, png_path)`` draws any such file: the reproduction (arXiv 2607.21535's draft-KV
tax, Sec. 1 and 4, in miniature: draft-attention cost against context per key set, and the per-step
draft and verify time behind the step-cost equation ``step = t_verify + t_draft``), the GPU kernel
sweep (wmtp/bench_attention.py), the draft-attention benchmark off CUDA (its first panel alone) or
the end-to-end decoding benchmark (wmtp/bench_decode.py: per-step draft and verify time per loop) or
the draft-depth benchmark (wmtp/bench_depth.py: time per token of each policy, per arm and context),
the acceptance benchmarks (wmtp/bench_sampling.py, bench_positions.py: AL per arm and variant), or
the batch benchmark (wmtp/bench_batch.py: each method's time per token a row against the batch size).
matplotlib's object API is used (no pyplot, no global state), and the PNG is written atomically.
"""

from __future__ import annotations

import json
from pathlib import Path

from .fileio import atomic_path

DRAFT_ATTENTION_KIND = "draft-attention"  # the "kind" of the JSON `wmtp bench attention` writes off CUDA
DECODE_KIND = "bench-decode"  # the "kind" of the JSON `wmtp bench decode` writes
DEPTH_KIND = "bench-depth"  # the "kind" of the JSON `wmtp bench depth` writes
SAMPLING_KIND = "bench-sampling"  # ... `wmtp bench sampling` writes: AL per arm and verify method
BATCH_KIND = "bench-batch"  # ... `wmtp bench batch` writes: time per token a row per method and batch size
POSITIONS_KIND = "bench-positions"  # ... `wmtp bench positions` writes: AL per arm and key positions


def _draft_attention_panel(ax, rows: list[dict]) -> None:
    """Median ms per draft query against context, one line per key set (``bench_draft_attention``'s rows)."""
    for label in dict.fromkeys(r["keyset"] for r in rows):
        pts = sorted((r["context"], r["median_s"] * 1e3) for r in rows if r["keyset"] == label)
        ax.plot(*zip(*pts), marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="context (keys)", ylabel="median ms per draft query",
           title="Draft attention alone")


def _finish(fig, axes, title: str, png_path: str | Path) -> None:
    """Grid and legend on every panel, the title, then the PNG written atomically."""
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def _draft_verify_lines(ax, contexts: list[int], label: str, draft: list[float], verify: list[float]) -> None:
    """One arm's per-step draft (solid) and verify (dashed) times against context, in one colour."""
    line = ax.plot(contexts, draft, marker="o", label=f"{label}: draft")[0]
    ax.plot(contexts, verify, marker="s", linestyle="--", color=line.get_color(), label=f"{label}: verify")


def plot_draft_attention(m: dict, png_path: str | Path) -> None:
    """One panel: what ``wmtp bench attention`` writes off CUDA (draft attention alone vs context)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4.2), layout="constrained")
    ax = fig.subplots()
    _draft_attention_panel(ax, m["rows"])
    env = m["environment"]
    _finish(fig, [ax], f"wmtp bench attention ({env['device']}, torch {env['versions']['torch']}, {m['dtype']})",
            png_path)


def plot_reproduction(m: dict, png_path: str | Path) -> None:
    """Three panels: draft attention alone vs context; draft and verify ms per step; acceptance."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.2), layout="constrained")
    ax_attn, ax_step, ax_acc = fig.subplots(1, 3)
    _draft_attention_panel(ax_attn, m["draft_attention"])
    contexts = [c["context"] for c in m["contexts"]]
    for label in m["contexts"][0]["arms"]:
        draft = [c["arms"][label]["draft_time_per_step_s"] * 1e3 for c in m["contexts"]]
        verify = [c["arms"][label]["verify_time_per_step_s"] * 1e3 for c in m["contexts"]]
        _draft_verify_lines(ax_step, contexts, label, draft, verify)
        ax_acc.plot(contexts, [c["arms"][label]["mean_accept_length"] for c in m["contexts"]], marker="o",
                    label=label)
    ax_step.set(xscale="log", xlabel="context (tokens)", ylabel="ms per speculative step",
                title="step = t_draft + t_verify")
    ax_acc.set(xscale="log", xlabel="context (tokens)", ylabel="tokens per target pass (AL)",
               title=f"Mean accept length, depth {m['config']['spec']['depth']}")
    env = m["environment"]
    _finish(fig, [ax_attn, ax_step, ax_acc], f"wmtp reproduce on {m['corpus']['name']}, preset {m['config']['preset']} "
            f"({env['device']}, torch {env['versions']['torch']}, decode {m['decode_dtype']})", png_path)


def plot_decode(m: dict, png_path: str | Path) -> None:
    """One panel per decode loop: dense ms per token, and per arm the draft and verify ms per step, vs context."""
    from matplotlib.figure import Figure

    loops = list(dict.fromkeys(r["loop"] for r in m["rows"]))
    if not loops:
        raise IndexError("no rows")  # render(): an incomplete file
    fig = Figure(figsize=(6.5 * len(loops), 4.6), layout="constrained")
    axes = fig.subplots(1, len(loops), squeeze=False)[0]
    for ax, loop in zip(axes, loops):
        rows = sorted((r for r in m["rows"] if r["loop"] == loop), key=lambda r: r["context"])
        contexts = [r["context"] for r in rows]
        ax.plot(contexts, [r["dense"]["tpot_s"] * 1e3 for r in rows], marker="o", color="black",
                label="dense: ms per token")
        for label in rows[0]["arms"]:
            draft = [r["arms"][label]["draft_time_per_step_s"] * 1e3 for r in rows]
            verify = [r["arms"][label]["verify_time_per_step_s"] * 1e3 for r in rows]
            _draft_verify_lines(ax, contexts, label, draft, verify)
        ax.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="ms (per step; dense: per token)",
               title=f"{loop} loop")
    env = m["environment"]
    _finish(fig, axes, f"wmtp bench decode ({env.get('device_name', env['device'])}, torch "
            f"{env['versions']['torch']}, decode {m['decode_dtype']}, depth {m['config']['spec']['depth']})", png_path)


def plot_batch(m: dict, png_path: str | Path) -> None:
    """A row of panels per context (and, where a run timed its prefills, a second row with them), a
    panel per (lengths, loop): each method's µs per token a row against the batch size, lockstep
    dashed, refilling batches dotted, the dense batch black."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    contexts = list(dict.fromkeys(r["context"] for r in m["rows"]))
    names = list(dict.fromkeys(n for r in m["rows"] for n in r["methods"] if n != "dense batch"))
    color = {"dense batch": "black", **{n: f"C{i}" for i, n in enumerate(names)}}  # a method's color in every panel
    columns = list(dict.fromkeys((r["lengths"], r["loop"]) for r in m["rows"]))
    if not contexts:
        raise IndexError("no rows")  # render(): an incomplete file
    measures = {"us_per_token_per_row": "decode steps"}
    if all("us_per_token_per_row_with_prefill" in x for r in m["rows"] for x in r["methods"].values()):
        measures["us_per_token_per_row_with_prefill"] = "with the prefills"
    panels = [(c, key) for c in contexts for key in measures]
    fig = Figure(figsize=(5.5 * len(columns), 4.2 * len(panels)), layout="constrained")
    grid = fig.subplots(len(panels), len(columns), squeeze=False)
    for (context, key), axes in zip(panels, grid):
        for ax, (lengths, loop) in zip(axes, columns):
            rows = sorted((r for r in m["rows"] if (r["context"], r["lengths"], r["loop"]) == (context, lengths, loop)),
                          key=lambda r: r["batch"])
            if not rows:
                ax.set_axis_off()
                continue
            for name in rows[-1]["methods"]:
                have = [r for r in rows if name in r["methods"]]
                ax.plot([r["batch"] for r in have], [r["methods"][name][key] for r in have],
                        marker="o", label=name, color=color[name],
                        linestyle="--" if name.startswith("lockstep") else ":" if name.startswith("refill") else "-")
            ax.set(xscale="log", yscale="log", xlabel="rows a batch (B)", ylabel="µs per token a prompt (median)",
                   title=f"{context} tokens, {lengths} lengths, {loop} loop: {measures[key]}")
            ax.set_xticks([r["batch"] for r in rows], [str(r["batch"]) for r in rows])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # 10, 20, 50, 100, ... labelled
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(NullFormatter())
    env = m["environment"]
    _finish(fig, [ax for axes in grid for ax in axes if ax.axison], f"wmtp bench batch "
            f"({env.get('device_name', env['device'])}, torch {env['versions']['torch']}, decode {m['decode_dtype']}, "
            f"depth {m['config']['spec']['depth']}; every run lossless)", png_path)


def _grouped_bars(ax, arms: list[str], series: dict[str, list[float]],
                  whiskers: dict[str, list[list[float]]] | None = None) -> None:
    """One group of bars per arm, one bar per series in each (``whiskers``: a series' (below, above))."""
    width = 0.8 / len(series)
    for i, (name, heights) in enumerate(series.items()):
        x = [a + (i - (len(series) - 1) / 2) * width for a in range(len(arms))]
        ax.bar(x, heights, width, label=name, **({"yerr": whiskers[name], "capsize": 3} if whiskers else {}))
    ax.set_xticks(range(len(arms)), [a.replace("+gate", "\n+gate") for a in arms])  # a gated label on two lines


def plot_depth(m: dict, png_path: str | Path) -> None:
    """One panel per context: each arm's TPOT per depth policy as bars, dense TPOT as a dashed line."""
    from matplotlib.figure import Figure

    rows, policies = m["rows"], m["policies"]
    if not rows:
        raise IndexError("no rows")  # render(): an incomplete file
    fig = Figure(figsize=(5.5 * len(rows), 4.6), layout="constrained")
    axes = fig.subplots(1, len(rows), squeeze=False)[0]
    for ax, row in zip(axes, rows):
        arms = list(row["arms"])
        _grouped_bars(ax, arms, {name: [row["arms"][arm]["policies"][name]["tpot_s"] * 1e3 for arm in arms]
                                 for name in policies})
        ax.axhline(row["dense"]["tpot_s"] * 1e3, color="black", linestyle="--", label="dense")
        ax.set(ylabel="ms per token kept (median of rounds)", title=f"{row['context']} tokens, {row['loop']} loop")
    env = m["environment"]
    _finish(fig, axes, f"wmtp bench depth ({env.get('device_name', env['device'])}, torch "
            f"{env['versions']['torch']}, decode {m['decode_dtype']}; every run lossless)", png_path)


def plot_acceptance(m: dict, png_path: str | Path) -> None:
    """A panel per (temperature, context), in a grid: each arm's mean accept length per variant (the
    sampling bench's verify methods, the positions bench's key positions) as bars, the seeds' range
    as whiskers."""
    from matplotlib.figure import Figure

    variant_key = "methods" if m["kind"] == SAMPLING_KIND else "positions"
    rows = m["rows"]
    if not rows:
        raise IndexError("no rows")  # render(): an incomplete file
    contexts = list(dict.fromkeys(r["context"] for r in rows))  # columns
    temperatures = list(dict.fromkeys(r["temperature"] for r in rows))  # rows of panels
    fig = Figure(figsize=(5.5 * len(contexts), 4.2 * len(temperatures)), layout="constrained")
    grid = fig.subplots(len(temperatures), len(contexts), squeeze=False)
    axes = [grid[temperatures.index(r["temperature"])][contexts.index(r["context"])] for r in rows]
    for ax, row in zip(axes, rows):
        arms = list(row["arms"])
        variants = row["arms"][arms[0]][variant_key]
        runs = {name: [row["arms"][arm][variant_key][name] for arm in arms] for name in variants}
        al = {name: [r["mean_accept_length"] for r in rs] for name, rs in runs.items()}
        spread = {name: [[a - min(r["mean_accept_length_per_seed"]) for a, r in zip(al[name], rs)],
                         [max(r["mean_accept_length_per_seed"]) - a for a, r in zip(al[name], rs)]]
                  for name, rs in runs.items()}
        _grouped_bars(ax, arms, al, spread)
        ax.set(ylabel="mean accept length (seeds pooled)", ylim=(0, None),
               title=f"{row['context']} tokens, temperature {row['temperature']:g}")
    env = m["environment"]
    bench = "sampling" if m["kind"] == SAMPLING_KIND else "positions"
    _finish(fig, axes, f"wmtp bench {bench} ({env.get('device_name', env['device'])}, torch "
            f"{env['versions']['torch']}, decode {m['decode_dtype']}; whiskers: the seeds' range)", png_path)


def render(json_path: str | Path, png_path: str | Path | None = None) -> Path:
    """Draw the metrics file ``json_path`` to ``png_path`` (default: the same name with ``.png``).

    Raises:
        ValueError: if the file is missing, not JSON, or of a kind this module does not know.
    """
    json_path = Path(json_path)
    if json_path.exists() and not json_path.is_file() and not json_path.is_dir():  # reading a FIFO would hang
        raise ValueError(f"metrics file {json_path} is not a regular file (a device, FIFO or socket)")
    try:
        m = json.loads(json_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no such metrics file: {json_path}") from None
    except OSError as e:  # a folder, no permission
        raise ValueError(f"cannot read metrics file {json_path}: {e.strerror or type(e).__name__}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{json_path} is not JSON ({e.msg}, line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{json_path} is not JSON (not UTF-8 text)") from None
    png_path = Path(png_path) if png_path else json_path.with_suffix(".png")
    kinds = {DRAFT_ATTENTION_KIND: (plot_draft_attention, "'wmtp bench attention' (off CUDA)"),
             DECODE_KIND: (plot_decode, "'wmtp bench decode'"), DEPTH_KIND: (plot_depth, "'wmtp bench depth'"),
             SAMPLING_KIND: (plot_acceptance, "'wmtp bench sampling'"),
             POSITIONS_KIND: (plot_acceptance, "'wmtp bench positions'"),
             BATCH_KIND: (plot_batch, "'wmtp bench batch'")}
    if isinstance(m, dict) and isinstance(m.get("kind"), str) and m["kind"] in kinds:  # a file naming its kind
        draw, kind = kinds[m["kind"]]
    elif isinstance(m, dict) and "contexts" in m and "draft_attention" in m:
        draw, kind = plot_reproduction, "'wmtp reproduce'"
    elif isinstance(m, dict) and "rows" in m and "methods" in m:
        from .bench_report import plot as draw

        kind = "'wmtp bench attention --device cuda'"
    else:
        raise ValueError(f"{json_path} is not a metrics file of 'wmtp reproduce' or 'wmtp bench' (attention, "
                         "decode, depth, sampling, positions, batch)")
    rows = m["rows"] if "rows" in m else m.get("contexts")
    if isinstance(rows, list) and not rows:  # matplotlib would draw empty axes
        raise ValueError(f"{json_path} is an incomplete {kind} metrics file: it has no rows to plot")
    try:
        draw(m, png_path)
    except (KeyError, IndexError, TypeError, AttributeError, ZeroDivisionError) as e:  # the right kind, not whole
        raise ValueError(f"{json_path} is an incomplete {kind} metrics file: {type(e).__name__}: {e}") from None
    return png_path
