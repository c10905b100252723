"""``wmtp bench batch``: batches of prompts decoded at once, side by side (beyond the paper, whose
runs decode one sequence; arXiv 2607.21535 Sec. 4-5 time one): the dense batch
(``batched_greedy_generate``), lockstep speculative batches (wmtp/lockstep.py: every row keeps the
batch's least match, so its prompts share one length), batches with a position a row
(wmtp/batched.py: every row keeps its own matches, prompts of any lengths) and, with more prompts
than rows, refilling batches (NOTE [Refill] there: a stopped row takes the next prompt, prefilled
alone, or with ``staged`` the waiting prompts prefilled ``B`` at a time), per context, batch size
``B`` and prompt lengths, in the eager loop and (on CUDA) the CUDA-graph loop.

Prompts: a cell decodes ``N = B * prompts_per_row`` prompts; prompt ``i`` is ``length_i`` tokens of
the corpus (its train, valid and test splits end to end) ending ``i * stride`` tokens before the
end, ``stride = min(c, (tokens - c) // (N - 1))``, so the prompts are different text where the
corpus allows. ``equal``: every prompt ``c`` tokens. ``mixed``: prompt ``i`` ``c - floor(i * c /
(2N))`` tokens, from ``c`` down to about ``c / 2``; lockstep needs one length and runs on ``equal``
cells only. Every method but the refilling ones decodes the prompts in waves of ``B``, one after
another; a refilling batch decodes them in ``B`` rows.

Every speculative run's outputs are asserted equal (``torch.equal``) to the same loop's dense batch
before anything is kept (float32 on a GPU: NOTE [Batch exactness] in wmtp/lockstep.py says why
exact equality is the expectation, not a law). Time is the decode steps' seconds: under ``graph``
the phases' device times (CUDA events), under ``eager`` wall-clock with a synchronize (the host's
launches included, its bookkeeping between phases not). Per run: ``us_per_token_per_row`` ``=
seconds / (N * (new_tokens - 1))``, the time a token of a prompt (a prompt's first token comes from
its prefill), the AL (tokens a live prompt kept per verify pass), the steps (verify passes) and,
with a position a row, each prompt's own AL (a wave steps until its slowest prompt is done), and
the speedup over the dense batch of the same cell (old/new - 1).

A server pays the prefills too (a wave's one batched prefill; a refilling batch's first ``B`` as one
batch and each later prompt's admission, ``Admitter`` in wmtp/rows.py: its prefill alone, or
``staged``, the prefill of ``B`` waiting prompts it starts and its copy into the row): each one's
wall-clock seconds after a synchronize, in both loops. ``us_per_token_per_row_with_prefill`` ``=
(seconds + prefill seconds) / (N * new_tokens)`` and its speedup; and with every prompt waiting from
the start, each prompt's latency in the timed seconds (the host's work between them not counted):
``median_first_token_ms`` and ``median_done_ms`` (its first and last new token, median over
prompts; a wave's prompts wait for the waves before it), ``last_done_ms`` (the last prompt's) and
``median_done_reduction_vs_dense_batch`` (1 - new/old). Every time is the median of ``rounds``
rounds, the methods interleaved within a round, after one untimed round: Triton specializes its
kernels on lengths, so a prefill of a new prompt length compiles first (without the warm-up, run
CR on the H200 timed a median first token of 4.8 s in a cell of 1024-token prompts).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .batched import batched_speculative_generate
from .bench_common import (
    LOOPS,
    add_keysets_argument,
    add_model_arguments,
    bench_cli,
    bench_setup,
    check_corpus_holds,
    model_options,
    out_help,
    progress_bar,
    with_capacity,
)
from .checks import check_int
from .config import Preset
from .lockstep import batched_greedy_generate, lockstep_generate
from .metrics import reduction, speedup
from .plots import BATCH_KIND
from .static_batched import static_batched_speculative_generate
from .static_lockstep import static_batched_greedy_generate, static_lockstep_generate

LENGTHS = ("equal", "mixed")
WARMUP = 1  # untimed rounds a cell: a prefill of a new prompt length compiles kernels first
MAX_PROMPTS = 4096  # prompts a cell (batch size x prompts a row): the bench builds them all up front


def prompt_lengths(context: int, batch: int, lengths: str) -> list[int]:
    """Each row's prompt length (the module docstring)."""
    return [context if lengths == "equal" else context - b * context // (2 * batch) for b in range(batch)]


def batch_prompts(text: torch.Tensor, context: int, batch: int, lengths: str) -> list[torch.Tensor]:
    """The rows of a batch: ``length_b`` tokens ending ``b * stride`` before the end of ``text``.

    Raises:
        ValueError: if ``text`` holds fewer than ``context`` tokens.
    """
    check_corpus_holds(text, context)
    stride = context if batch == 1 else min(context, (text.numel() - context) // (batch - 1))
    end = text.numel()
    return [text[end - b * stride - n: end - b * stride] for b, n in enumerate(prompt_lengths(context, batch, lengths))]


def methods(preset: Preset, loop: str, equal: bool, rows: int, refill: bool) -> dict[str, Callable]:
    """Each method's run ``(target, head, prompts) -> (outputs, seconds, counts)``, the dense batch
    first: every method decodes the prompts in waves of ``rows``, a wave's rows together; with
    ``refill``, ``refill <key set>`` decodes them in ``rows`` rows, a stopped row taking the next
    prompt (NOTE [Refill] in wmtp/batched.py), and ``refill staged <key set>`` so with the waiting
    prompts prefilled ``rows`` at a time (``prefill_batch``). Lockstep only for prompts of one length. ``counts``:
    the AL (``None`` for the dense batch), the steps (verify passes), with a position a row each
    prompt's own AL, and ``timeline``'s."""
    spec, graph = preset.spec, {"cuda_graph": True} if loop == "graph" else {}
    dense_gen = static_batched_greedy_generate if loop == "graph" else batched_greedy_generate
    lock_gen = static_lockstep_generate if loop == "graph" else lockstep_generate
    own_gen = static_batched_speculative_generate if loop == "graph" else batched_speculative_generate

    def waves(prompts):
        return [prompts[w: w + rows] for w in range(0, len(prompts), rows)]

    def dense(target, head, prompts):
        outs, seconds, steps, prefills, first, done = [], 0.0, 0, [], [], []
        for wave in waves(prompts):
            times: list[float] = []
            outs += dense_gen(target, wave, spec.new_tokens, step_times=times, prefill_times=prefills, **graph)
            ready = seconds + sum(prefills)  # every row of a wave runs to its end (no eos here)
            first, done = first + [ready] * len(wave), done + [ready + sum(times)] * len(wave)
            seconds, steps = seconds + sum(times), steps + len(times)
        return outs, seconds, {"mean_accept_length": None, "steps": steps, **timeline(prefills, first, done)}

    def speculative(gen, ks, lockstep, in_waves=True, prefill_batch=1):
        def run(target, head, prompts):
            outs, seconds, runs, prefills, first, done = [], 0.0, [], [], [], []
            for wave in waves(prompts) if in_waves else [prompts]:
                o, stats = gen(target, head, torch.stack(wave) if lockstep else wave, spec.new_tokens, spec.depth,
                               ks.n_sink, ks.window, **graph,
                               **({} if in_waves else {"max_batch": rows, "prefill_batch": prefill_batch}))
                start, steps_s = seconds + sum(prefills), sum(stats.draft_times_s) + sum(stats.verify_times_s)
                pre = sum(stats.prefill_times_s)  # lockstep's rows all run to the wave's end (no eos here)
                ft, dt = ([pre] * len(wave), [pre + steps_s] * len(wave)) if lockstep else (stats.first_token_s,
                                                                                           stats.done_s)
                first, done = first + [start + t for t in ft], done + [start + t for t in dt]
                outs, seconds, runs, prefills = (outs + o, seconds + steps_s, runs + [stats],
                                                 prefills + stats.prefill_times_s)
            steps = sum(st.steps for st in runs)
            times = timeline(prefills, first, done)
            if lockstep:
                return outs, seconds, {"mean_accept_length": sum(st.committed for st in runs) / steps, "steps": steps,
                                       **times}
            committed = [c for st in runs for c in st.committed]
            live = [n for st in runs for n in st.live_steps]  # a wave steps until its slowest prompt is done
            return outs, seconds, {"mean_accept_length": sum(committed) / max(sum(live), 1), "steps": steps,
                                   "row_accept_lengths": [c / max(n, 1) for c, n in zip(committed, live)], **times}
        return run

    runs = {"dense batch": dense}
    for ks in spec.keysets:
        if equal:
            runs[f"lockstep {ks.label}"] = speculative(lock_gen, ks, True)
        runs[f"own positions {ks.label}"] = speculative(own_gen, ks, False)
        if refill:
            runs[f"refill {ks.label}"] = speculative(own_gen, ks, False, in_waves=False)
            runs[f"refill staged {ks.label}"] = speculative(own_gen, ks, False, in_waves=False, prefill_batch=rows)
    return runs


def timeline(prefills: list[float], first: list[float], done: list[float]) -> dict:
    """A run's prefill seconds and each prompt's times, from the run's start: its first new token and
    its last (``BatchedStats.first_token_s`` and ``done_s``; waves one after another)."""
    return {"prefill_seconds": sum(prefills), "prefills": len(prefills),  # the timed spans (a staged copy is one)
            "first_token_s": first, "done_s": done}


def run_cell(target, head, prompts: list[torch.Tensor], preset: Preset, loop: str, rounds: int, equal: bool,
             rows: int | None = None) -> dict:
    """Every method on the prompts in ``rows`` rows (``None``: one wave of every prompt), ``rounds``
    times interleaved after an untimed round (``WARMUP``); lossless asserted against the dense batch."""
    N, new = len(prompts), preset.spec.new_tokens
    B = rows or N
    runs = methods(preset, loop, equal, B, refill=N > B)
    got: dict[str, list[tuple[float, dict]]] = {name: [] for name in runs}
    for r in range(WARMUP + rounds):
        want = None
        for name, run in runs.items():
            outs, seconds, counts = run(target, head, prompts)
            want = outs if want is None else want
            if len(outs) != len(want) or not all(torch.equal(o, w) for o, w in zip(outs, want)):
                raise AssertionError(f"{name} ({loop} loop, B={B}) is not token-equal to the dense batch")
            if r >= WARMUP:
                got[name].append((seconds, counts))
    cell = {}
    for name, rs in got.items():  # the counts: the first round's (at a fixed depth every round's)
        seconds = statistics.median(s for s, _ in rs)
        with_prefill = statistics.median(s + c["prefill_seconds"] for s, c in rs)
        times = {"prefill_seconds_rounds": [c["prefill_seconds"] for _, c in rs],
                 "us_per_token_per_row_with_prefill": with_prefill / (N * new) * 1e6,
                 "median_first_token_ms": statistics.median(statistics.median(c["first_token_s"]) for _, c in rs) * 1e3,
                 "median_done_ms": statistics.median(statistics.median(c["done_s"]) for _, c in rs) * 1e3,
                 "last_done_ms": statistics.median(max(c["done_s"]) for _, c in rs) * 1e3}
        counts = {k: v for k, v in rs[0][1].items() if k not in ("prefill_seconds", "first_token_s", "done_s")}
        cell[name] = {"seconds_rounds": [s for s, _ in rs], "us_per_token_per_row": seconds / (N * (new - 1)) * 1e6,
                      **counts, **times}
    base = cell["dense batch"]
    for m in cell.values():
        m["speedup_vs_dense_batch"] = speedup(base["us_per_token_per_row"], m["us_per_token_per_row"])
        m["speedup_with_prefill_vs_dense_batch"] = speedup(base["us_per_token_per_row_with_prefill"],
                                                           m["us_per_token_per_row_with_prefill"])
        m["median_done_reduction_vs_dense_batch"] = reduction(base["median_done_ms"], m["median_done_ms"])
    return cell


def bench_batch(preset: Preset, dataset_dir: str | None, device: torch.device, seed: int, contexts: tuple[int, ...],
                batches: tuple[int, ...], lengths: tuple[str, ...], loops: tuple[str, ...], rounds: int,
                cache_dir: Path, command: str, progress: bool = False, log=print,
                on_row: Callable[[dict], object] | None = None, prompts_per_row: int = 1) -> dict:
    """Load (or train) reproduce's models, then every (context, lengths, batch size, loop) cell, each
    of ``prompts_per_row`` prompts a row (more than one: in waves, and refilling rows).

    ``on_row`` gets the metrics so far after each cell, to write a partial file.

    Raises:
        ValueError: for options ``check_options`` refuses, or a context the corpus cannot fill.
    """
    check_options(preset, batches, lengths, loops, rounds, device, prompts_per_row)
    t_start = time.perf_counter()
    setup = bench_setup(BATCH_KIND, preset, dataset_dir, device, seed, contexts, cache_dir, command, progress, log)
    spec = preset.spec  # the graph loop's caches hold K + 1 positions more (wmtp/static_batched.py)
    target, head = with_capacity(setup.target, setup.head, max(contexts) + spec.new_tokens + 2 * spec.depth + 2)
    result = {**setup.header, "lossless": "asserted: every run's rows equal the same loop's dense batch (torch.equal)",
              "batch_sizes": list(batches), "prompts_per_row": prompts_per_row, "lengths": list(lengths),
              "loops": list(loops), "rounds": rounds, "warmup_rounds": WARMUP,
              "rows": [], "complete": False}
    cells = [(c, ln, B, lp) for c in contexts for ln in lengths for B in batches for lp in loops
             if ln == "equal" or B * prompts_per_row > 1]  # one prompt has one length
    with progress_bar(progress) as bar:
        task = bar.add_task("bench batch", total=len(cells))
        for c, ln, B, lp in cells:
            prompts = [p.to(device) for p in batch_prompts(setup.text, c, B * prompts_per_row, ln)]
            bar.update(task, description=f"context {c}, {ln} lengths, B={B}, {lp} loop")
            cell = run_cell(target, head, prompts, preset, lp, rounds, ln == "equal", B)
            result["rows"].append({"context": c, "lengths": ln, "prompt_lengths": [p.numel() for p in prompts],
                                   "batch": B, "prompts": len(prompts), "loop": lp, "new_tokens": spec.new_tokens,
                                   "methods": cell})
            result["wall_time_s"] = time.perf_counter() - t_start
            bar.advance(task)
            log(f"context {c}, {ln} lengths, B={B}, {lp} loop: done")
            if on_row is not None:
                on_row(result)
    result["complete"] = True
    return result


def check_options(preset: Preset, batches: tuple[int, ...], lengths: tuple[str, ...], loops: tuple[str, ...],
                  rounds: int, device: torch.device, prompts_per_row: int = 1) -> None:
    """``ValueError`` for options the bench cannot run, before any model is loaded."""
    if not batches or any(b < 1 for b in batches) or len(set(batches)) < len(batches):
        raise ValueError(f"--batch-sizes must be integers >= 1, each once, got {list(batches)}")
    if not lengths or not set(lengths) <= set(LENGTHS) or len(set(lengths)) < len(lengths):
        raise ValueError(f"--lengths must be distinct ones of {', '.join(LENGTHS)}, got {list(lengths)}")
    check_int("--prompts-per-row", prompts_per_row, 1)
    if max(batches) * prompts_per_row > MAX_PROMPTS:
        raise ValueError(f"a cell decodes --batch-sizes x --prompts-per-row prompts, at most {MAX_PROMPTS}; got "
                         f"{max(batches)} x {prompts_per_row}")
    if lengths == ("mixed",) and set(batches) == {1} and prompts_per_row == 1:
        raise ValueError("--lengths mixed needs more than one prompt (a batch size or --prompts-per-row above 1)")
    if not loops or not set(loops) <= set(LOOPS) or len(set(loops)) < len(loops):
        raise ValueError(f"--loops must be distinct ones of {', '.join(LOOPS)}, got {list(loops)}")
    if "graph" in loops and device.type != "cuda":
        raise ValueError(f"the graph loop captures CUDA graphs; device {device.type} has none (use --loops eager)")
    if rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {rounds}")
    if any(ks.gate is not None for ks in preset.spec.keysets):
        raise ValueError("batched decoding has no gated draft: drop @GATE from --keysets")


def table(result: dict):
    """A rich table: one line per (cell, method), the dense batch first; decode steps alone, then
    with the prefills, then each prompt's latency (median over prompts)."""
    from rich.table import Table

    env = result["environment"]
    t = Table(title=f"wmtp bench batch ({env.get('device_name', env['device'])}, {result['decode_dtype']}, "
              f"depth {result['config']['spec']['depth']})")
    for col in ("context", "lengths", "B", "loop", "method", "AL", "steps", "µs/token/row", "speedup",
                "+prefills µs/token/row", "+prefills speedup", "first token ms", "done ms", "done reduction"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        for i, (name, m) in enumerate(r["methods"].items()):
            al = m["mean_accept_length"]
            t.add_row(*([str(r["context"]), r["lengths"], str(r["batch"]), r["loop"]] if i == 0 else [""] * 4), name,
                      "1" if al is None else f"{al:.2f}", str(m["steps"]), f"{m['us_per_token_per_row']:.1f}",
                      "" if i == 0 else f"{m['speedup_vs_dense_batch']:+.0%}",
                      f"{m['us_per_token_per_row_with_prefill']:.1f}",
                      "" if i == 0 else f"{m['speedup_with_prefill_vs_dense_batch']:+.0%}",
                      f"{m['median_first_token_ms']:.1f}", f"{m['median_done_ms']:.1f}",
                      "" if i == 0 else f"{m['median_done_reduction_vs_dense_batch']:+.0%}")
    return t


def add_arguments(p) -> None:
    """``wmtp bench batch``'s options (wmtp/cli.py builds the parser)."""
    add_model_arguments(p)
    add_keysets_argument(p, gates=False)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 16384],
                   help="the longest prompt of a batch (default: 1024 16384)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                   help="prompts a batch (default: 1 2 4 8 16)")
    p.add_argument("--lengths", nargs="+", choices=LENGTHS, default=list(LENGTHS),
                   help="equal: every prompt the context's length; mixed: from the context down to about half "
                        "of it (default: both)")
    p.add_argument("--loops", nargs="+", choices=LOOPS, default=None,
                   help="decode loops to time (default: graph on CUDA, eager elsewhere)")
    p.add_argument("--prompts-per-row", type=int, default=1,
                   help="prompts a row of the batch: above 1, every method decodes them in waves of the batch "
                        "size, and a refilling batch in its rows, a stopped row taking the next; at most "
                        f"{MAX_PROMPTS} prompts a cell, batch size x this (default: 1)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of every method, interleaved; times are their median (default: 3)")
    p.add_argument("--out", type=Path, default=None,
                   help="write the JSON here and its plot beside it " + out_help("batch"))


def cli(args, prog: str, argv: list[str]) -> int:
    """Run ``wmtp bench batch``: check the options, write the JSON after every cell, print a table."""
    device, preset, slug = model_options(args)
    loops = tuple(args.loops or (("graph",) if device.type == "cuda" else ("eager",)))
    batches, lengths = tuple(args.batch_sizes), tuple(args.lengths)
    check_options(preset, batches, lengths, loops, args.rounds, device, args.prompts_per_row)
    return bench_cli(args, prog, argv, "batch", slug, lambda command, log, on_row: bench_batch(
        preset, args.dataset_dir, device, args.seed, tuple(args.contexts), batches, lengths, loops, args.rounds,
        args.cache_dir, command, progress=not args.no_progress, log=log, on_row=on_row,
        prompts_per_row=args.prompts_per_row), table, plot=True)


