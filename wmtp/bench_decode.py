"""``wmtp bench decode``: end-to-end decoding at long contexts, eager loops beside device-resident
(CUDA-graph) loops, every draft arm beside dense greedy decoding (arXiv 2607.21535, Sec. 4-5: TPOT,
and the draft-KV tax as the draft's share of a decode step).

For each context: dense greedy decoding, then every key set of the preset's ``SpecConfig``
(native first), each run once per loop; every arm's output is asserted equal (``torch.equal``) to
the same loop's dense output before anything is kept. Every run at a context starts from ONE
prefill of its prompt (``prefill_prompt``, wmtp/prefill.py: the target's and the head's caches,
copied per run), timed once as ``prefill_s``. Times are medians over decode steps (a first step
that compiles Triton kernels is one step of many): per step the draft phase, the verify phase,
their share, and TPOT ``= (t_draft + t_verify) / AL`` (wmtp/metrics.py). Under ``loop="graph"``
the phases are CUDA graphs timed by CUDA events (wmtp/static_decode.py); under ``loop="eager"``
they are wall-clock times with a synchronize (wmtp/decode.py), the host's launches included.
``draft_keys_read_per_step`` counts the keys of every draft query run: the graph loop's extend runs
``depth + 1`` rows (NOTE [Static extend]), the eager loop's only the ``a + 1`` committed positions,
so the two loops' counts differ.

The models are reproduce's (the same checkpoint: wmtp/reproduce.py ``prepare_models``), with the
KV-cache capacity raised to the longest context (their weights do not depend on it). The prompt is
the last ``context`` tokens of the corpus's train, valid and test splits end to end, so decoding
continues the test split while the far context is text the models trained on: acceptance at these
lengths is this small model's, on this text, and says nothing general.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import data
from .config import Preset
from .decode import DRAFT_CACHES, greedy_generate, speculative_generate
from .device import synchronize
from .metrics import SCHEMA_VERSION, environment, reduction, speedup, tpot
from .model import TargetLM
from .mtp import MTPHead
from .plots import DECODE_KIND
from .prefill import Prefill, prefill_prompt
from .reproduce import prepare_models
from .static_decode import static_greedy_generate, static_speculative_generate

LOOPS = ("eager", "graph")


def with_capacity(target: TargetLM, head: MTPHead, max_len: int) -> tuple[TargetLM, MTPHead]:
    """Copies of ``target`` and ``head`` whose config holds ``max_len`` cache positions, same weights."""
    big = TargetLM(dataclasses.replace(target.config, max_seq_len=max_len)).to(target.embed)
    big.load_state_dict(target.state_dict())
    big_head = MTPHead(head.config, big).to(head.proj)
    big_head.load_state_dict(head.state_dict())
    return big.eval(), big_head.eval()


def long_prompt(tokens: dict[str, torch.Tensor], context: int) -> torch.Tensor:
    """The last ``context`` tokens of the train, valid and test splits end to end.

    Raises:
        ValueError: if the splits hold fewer tokens.
    """
    text = torch.cat([tokens["train"], tokens["valid"], tokens["test"]])
    if text.numel() < context:
        raise ValueError(f"the corpus has {text.numel()} tokens; context {context} needs more")
    return text[-context:]


def _runners(loop: str) -> tuple[Callable, Callable]:
    """The loop's two generators; ``graph`` insists on CUDA graphs (a ValueError where they cannot be
    captured, never rows labelled ``graph`` that ran without them)."""
    if loop == "eager":
        return greedy_generate, speculative_generate
    return (lambda *a, **k: static_greedy_generate(*a, cuda_graph=True, **k),
            lambda *a, **k: static_speculative_generate(*a, cuda_graph=True, **k))


def timed_prefill(target: TargetLM, head: MTPHead, prompt: torch.Tensor, preset: Preset,
                  page_size: int | None = None) -> tuple[Prefill, float]:
    """The prompt's one prefill for every run at its context (room for the longest run; paged caches
    with ``page_size``), and its seconds."""
    synchronize(prompt.device)
    t0 = time.perf_counter()
    pre = prefill_prompt(target, prompt, prompt.numel() + preset.spec.new_tokens + preset.spec.depth, draft=head,
                         page_size=page_size)
    synchronize(prompt.device)
    return pre, time.perf_counter() - t0


def run_context(target: TargetLM, head: MTPHead, prompt: torch.Tensor, preset: Preset, loop: str,
                prefill: Prefill, draft_caches: tuple[str, ...] = ("full",)) -> dict:
    """Dense decoding and every draft arm at one context with one loop, each from ``prefill``;
    lossless asserted first. A windowed key set runs once per draft cache of ``draft_caches`` (the
    ring's arm is labelled ``"<key set> ring"``; the native draft has no ring)."""
    spec = preset.spec
    greedy, speculative = _runners(loop)
    dense_steps: list[float] = []
    dense = greedy(target, prompt, spec.new_tokens, step_times=dense_steps, prefill=prefill)
    dense_step = statistics.median(dense_steps)
    row = {"context": prompt.numel(), "loop": loop, "new_tokens": len(dense),
           "dense": {"step_median_s": dense_step, "tpot_s": dense_step}, "arms": {}}
    native_draft = None
    arms = [(ks, cache) for ks in sorted(spec.keysets, key=lambda c: c.window is not None)  # native first
            for cache in draft_caches if ks.window is not None or cache == "full"]
    for ks, cache in arms:
        label = ks.label if cache == "full" else f"{ks.label} {cache}"
        out, stats = speculative(target, head, prompt, spec.new_tokens, spec.depth, ks.n_sink, ks.window,
                                 prefill=prefill, draft_cache=cache)
        if not torch.equal(out, dense):
            raise AssertionError(f"arm {label} ({loop} loop) at context {prompt.numel()} is not lossless")
        draft_step, verify_step = statistics.median(stats.draft_times_s), statistics.median(stats.verify_times_s)
        native_draft = draft_step if ks.window is None else native_draft
        t = tpot(verify_step, draft_step, stats.mean_accept_length)
        row["arms"][label] = {
            "lossless": True, "n_sink": ks.n_sink, "window": ks.window, "draft_cache": cache,
            "draft_kv_bytes": stats.draft_kv_bytes, "steps": stats.steps,
            "acceptance_rate": stats.acceptance_rate, "mean_accept_length": stats.mean_accept_length,
            "draft_keys_read_per_step": stats.draft_keys_read / stats.steps,
            "draft_time_per_step_s": draft_step, "verify_time_per_step_s": verify_step,
            "draft_share_of_step": draft_step / (draft_step + verify_step),
            "tpot_s": t, "tpot_speedup_vs_dense": speedup(dense_step, t),
            "draft_time_reduction_vs_native": None if native_draft is None else reduction(native_draft, draft_step),
        }
    return row


class BenchSetup(NamedTuple):
    """What a bench on reproduce's models starts from: the models (capacity raised, in the decode
    dtype), one prompt a context, and the metrics JSON's provenance fields."""

    target: TargetLM
    head: MTPHead
    prompts: dict[int, torch.Tensor]
    header: dict


def bench_setup(kind: str, preset: Preset, dataset_dir: str | None, device: torch.device, seed: int,
                contexts: tuple[int, ...], cache_dir: Path, command: str, progress: bool, log) -> BenchSetup:
    """Load the corpus, tokenizer and reproduce's models (training them if no checkpoint fits), each
    context's prompt (checked before any training), and the header every bench JSON begins with."""
    corpus = data.load_corpus(dataset_dir, max_chars=preset.train.max_train_chars)
    log(corpus.message)
    tokens = data.corpus_token_splits(corpus, data.train_tokenizer(corpus, preset.model.vocab_size, cache_dir))
    prompts = {c: long_prompt(tokens, c) for c in contexts}  # every context checked before the training
    target, head, train_info = prepare_models(preset, corpus, tokens, seed, device, cache_dir, None, progress, log)
    dtype = torch.float64 if device.type == "cpu" else torch.float32  # decode.py NOTE [Exactness]
    capacity = max(contexts) + preset.spec.new_tokens + preset.spec.depth
    target, head = with_capacity(target.to(dtype), head.to(dtype), capacity)
    header = {
        "schema_version": SCHEMA_VERSION, "kind": kind, "command": command, "seed": seed,
        "corpus": {"name": corpus.name, "fingerprint": corpus.fingerprint,
                   "tokens": {k: int(v.numel()) for k, v in tokens.items()}},
        "config": {"preset": preset.name, "model": asdict(preset.model), "mtp": asdict(preset.mtp),
                   "spec": asdict(preset.spec), "kv_capacity": capacity},
        "decode_dtype": str(dtype).removeprefix("torch."), "environment": environment(device),
        "checkpoint": {k: v for k, v in train_info.items() if not k.endswith("losses")},
    }
    return BenchSetup(target, head, prompts, header)


def progress_bar(enabled: bool) -> Progress:
    """The benches' rich progress bar (``enabled=False``: silent)."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled)


def run_contexts(name: str, setup: BenchSetup, preset: Preset, device: torch.device, contexts: tuple[int, ...],
                 units: int, rows: Callable, result: dict, t_start: float, progress: bool, log,
                 on_context: Callable[[dict], object] | None, page_size: int | None = None) -> dict:
    """What every bench does per context: ONE timed prefill of its prompt, then the rows
    ``rows(prompt, prefill, tick)`` yields (``tick(what)`` advances the progress bar by one of the
    context's ``units``), each kept with ``prefill_s``, the metrics so far handed to ``on_context``
    after every row (to write a partial file); ``page_size``: the prefill's caches paged. Returns
    ``result``, marked complete."""
    with progress_bar(progress) as bar:  # a prefill and every unit are one step of the bar
        task = bar.add_task(name, total=len(contexts) * (1 + units))
        for c in contexts:
            prompt = setup.prompts[c].to(device)
            bar.update(task, description=f"context {c}: prefill")
            pre, prefill_s = timed_prefill(setup.target, setup.head, prompt, preset, page_size)
            bar.advance(task)
            log(f"context {c}: prefilled in {prefill_s:.1f} s")

            def tick(what: str, c=c) -> None:
                bar.update(task, advance=1, description=f"context {c}: {what} done")

            for row in rows(prompt, pre, tick):
                result["rows"].append({**row, "prefill_s": prefill_s})
                result["wall_time_s"] = time.perf_counter() - t_start
                log(f"context {c}: row {len(result['rows'])} done")
                if on_context is not None:
                    on_context(result)
    result["complete"] = True
    return result


def bench_decode(preset: Preset, dataset_dir: str | None, device: torch.device, seed: int, contexts: tuple[int, ...],
                 loops: tuple[str, ...], cache_dir: Path, command: str, progress: bool = False, log=print,
                 on_context: Callable[[dict], object] | None = None, draft_caches: tuple[str, ...] = ("full",),
                 page_size: int | None = None) -> dict:
    """Load (or train) reproduce's models, then ``run_context`` for every context and loop (every
    windowed arm with each of ``draft_caches``: ``"full"``, ``"ring"``; with ``page_size`` the target's
    and the full draft's KV are paged, ``PagedKVCache``).

    ``on_context`` gets the metrics so far after each (context, loop), to write a partial file.

    Raises:
        ValueError: for an unknown loop or draft cache, a context the corpus cannot fill, or ``graph`` off CUDA.
    """
    if not loops or any(lp not in LOOPS for lp in loops):
        raise ValueError(f"loops must be some of {', '.join(LOOPS)}, got {list(loops)}")
    if not draft_caches or not set(draft_caches) <= set(DRAFT_CACHES) or len(set(draft_caches)) < len(draft_caches):
        raise ValueError(f"draft caches must be distinct ones of {', '.join(DRAFT_CACHES)}, got {list(draft_caches)}")
    if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
        raise ValueError(f"--page-size must be an integer >= 1, got {page_size!r}")
    if "graph" in loops and device.type != "cuda":
        raise ValueError(f"the graph loop captures CUDA graphs; device {device.type} has none (use --loops eager)")
    t_start = time.perf_counter()
    setup = bench_setup(DECODE_KIND, preset, dataset_dir, device, seed, contexts, cache_dir, command, progress, log)
    result = {
        **setup.header,
        "lossless": "asserted: every arm's tokens equal the same loop's dense greedy tokens (torch.equal)",
        "draft_caches": list(draft_caches), "page_size": page_size, "rows": [], "complete": False,
    }

    def rows(prompt, pre, tick):
        for loop in loops:
            row = run_context(setup.target, setup.head, prompt, preset, loop, pre, draft_caches)
            tick(f"{loop} loop, dense and {len(preset.spec.keysets)} arms")
            yield row

    return run_contexts("bench decode", setup, preset, device, contexts, len(loops), rows, result, t_start, progress,
                        log, on_context, page_size)


def table(result: dict):
    """A rich table: one line per (context, loop, arm), dense first."""
    from rich.table import Table

    env = result["environment"]
    t = Table(title=f"wmtp bench decode ({env.get('device_name', env['device'])}, {result['decode_dtype']})")
    for col in ("context", "loop", "arm", "AL", "draft ms/step", "verify ms/step", "draft share", "TPOT ms",
                "TPOT speedup vs dense", "draft-time reduction vs native"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        t.add_row(str(r["context"]), r["loop"], "dense", "1", "", "", "", f"{r['dense']['tpot_s'] * 1e3:.3f}", "", "")
        for label, a in r["arms"].items():
            red = a["draft_time_reduction_vs_native"]
            t.add_row("", "", label, f"{a['mean_accept_length']:.2f}", f"{a['draft_time_per_step_s'] * 1e3:.3f}",
                      f"{a['verify_time_per_step_s'] * 1e3:.3f}", f"{a['draft_share_of_step']:.0%}",
                      f"{a['tpot_s'] * 1e3:.3f}", f"{a['tpot_speedup_vs_dense']:+.0%}",
                      "-" if red is None or a["window"] is None else f"{red:.0%}")
    return t


def add_model_arguments(p) -> None:
    """The options every bench on reproduce's models shares (bench decode's, bench sampling's)."""
    p.add_argument("--device", default="auto", help="cpu, mps, cuda or auto (default: auto)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per run (default: the preset's)")
    p.add_argument("--preset", default="small", help="named preset (default: small, reproduce's models)")
    p.add_argument("--dataset-dir", default=None, help="as reproduce's (default: the offline corpus fallback)")
    p.add_argument("--seed", type=int, default=42, help="the models' seed, as reproduce's (default: 42)")
    p.add_argument("--cache-dir", type=Path, default=Path(".wmtp-cache"),
                   help="tokenizer and checkpoint cache, shared with reproduce (default: .wmtp-cache)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def model_options(args) -> tuple[torch.device, Preset, str]:
    """``add_model_arguments``' options checked: the device, the preset (``--new-tokens`` applied) and
    the device's name in default file names (``h200``, ``cuda``, ``cpu`` or ``mps``)."""
    from .config import get_preset
    from .device import resolve_device

    device = resolve_device(args.device)
    if any(c < 2 for c in args.contexts) or (args.new_tokens is not None and args.new_tokens < 2):
        raise ValueError("--contexts and --new-tokens must be at least 2")
    preset = get_preset(args.preset)
    if args.new_tokens is not None:
        preset = dataclasses.replace(preset, spec=dataclasses.replace(preset.spec, new_tokens=args.new_tokens))
    slug = device.type if device.type != "cuda" else (
        "h200" if "H200" in torch.cuda.get_device_name(device) else "cuda")
    return device, preset, slug


def add_arguments(p) -> None:
    """``wmtp bench decode``'s options (wmtp/cli.py builds the parser)."""
    add_model_arguments(p)
    p.add_argument("--contexts", type=int, nargs="+", default=[16384, 131072],
                   help="prompt lengths (default: 16384 131072)")
    p.add_argument("--loops", nargs="+", choices=LOOPS, default=None,
                   help="decode loops to time (default: eager and graph on CUDA, eager elsewhere)")
    p.add_argument("--draft-caches", nargs="+", choices=DRAFT_CACHES, default=["full"],
                   help="the windowed arms' draft KV: full, ring, or both (default: full)")
    p.add_argument("--page-size", type=int, default=None,
                   help="keep the KV caches paged, in pages of this many positions (default: contiguous)")
    p.add_argument("--out", type=Path, default=None,
                   help="write the JSON here, its plot beside it as .png "
                        "(default: metrics/bench-decode-<h200|cuda|cpu|mps>.json)")


def cli(args, prog: str, argv: list[str]) -> int:
    """Run ``wmtp bench decode``: check the options, write the JSON after every context, print a table."""
    import shlex

    from rich.console import Console

    from .fileio import check_distinct, check_writable
    from .metrics import write_json

    device, preset, slug = model_options(args)
    loops = tuple(args.loops or (LOOPS if device.type == "cuda" else ("eager",)))
    out = args.out or Path("metrics") / f"bench-decode-{slug}.json"
    check_writable(out, "--out")
    check_writable(out.with_suffix(".png"), "--out's plot")
    check_distinct(out, out.with_suffix(".png"), "--out", "its plot")
    err = Console(stderr=True)

    def log(line: str) -> None:
        err.print(line, markup=False, highlight=False, soft_wrap=True)

    result = bench_decode(preset, args.dataset_dir, device, args.seed, tuple(args.contexts), loops, args.cache_dir,
                          shlex.join([prog, *argv]), progress=not args.no_progress, log=log,
                          on_context=lambda partial: write_json(out, partial), draft_caches=tuple(args.draft_caches),
                          page_size=args.page_size)
    write_json(out, result)
    from .plots import render

    png = render(out)
    Console(width=200).print(table(result))
    log(f"wrote {out} and {png} in {result['wall_time_s']:.0f} s")
    return 0
