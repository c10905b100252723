"""What every ``wmtp bench`` on reproduce's models shares (arXiv 2607.21535, Sec. 4-5, measured on
this library's small models): the models (reproduce's checkpoint, the KV-cache capacity raised to
the longest context), one prompt a context (the last ``context`` tokens of the corpus's splits end
to end), ONE timed prefill a context shared by every run at it, the per-context driver with its
progress bar and partial writes, the options of the command line and its output. ``bench decode``,
``bench sampling``, ``bench depth`` and ``bench positions`` (wmtp/bench_*.py) each add their rows.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import data, reproduce, tokenizer
from .config import Preset
from .decode import greedy_generate, speculative_generate
from .device import synchronize
from .metrics import SCHEMA_VERSION, environment
from .model import TargetLM
from .mtp import MTPHead
from .prefill import Prefill, prefill_prompt
from .static_decode import static_greedy_generate, static_speculative_generate

LOOPS = ("eager", "graph")  # wmtp/decode.py's loops; wmtp/static_decode.py's, in CUDA graphs


def loop_generators(loop: str) -> tuple[Callable, Callable]:
    """The loop's greedy and speculative generators; ``graph`` insists on CUDA graphs (a ValueError
    where they cannot be captured, never rows labelled ``graph`` that ran without them)."""
    if loop == "eager":
        return greedy_generate, speculative_generate
    return (lambda *a, **k: static_greedy_generate(*a, cuda_graph=True, **k),
            lambda *a, **k: static_speculative_generate(*a, cuda_graph=True, **k))


def with_capacity(target: TargetLM, head: MTPHead, max_len: int) -> tuple[TargetLM, MTPHead]:
    """Copies of ``target`` and ``head`` whose config holds ``max_len`` cache positions, same weights."""
    big = TargetLM(dataclasses.replace(target.config, max_seq_len=max_len)).to(target.embed)
    big.load_state_dict(target.state_dict())
    big_head = MTPHead(head.config, big).to(head.proj)
    big_head.load_state_dict(head.state_dict())
    return big.eval(), big_head.eval()


def check_corpus_holds(text: torch.Tensor, context: int, flag: str = "--contexts") -> None:
    """Raise a ValueError, naming ``flag`` and the most it may ask, if ``text`` holds fewer than ``context``
    tokens (the benches' default contexts are long: ``--preset tiny``'s capped corpus cannot fill them)."""
    if text.numel() < context:
        raise ValueError(f"the corpus has {text.numel()} tokens; context {context} needs more: pass {flag} of "
                         f"at most {text.numel()} tokens")


def long_prompt(tokens: dict[str, torch.Tensor], context: int, flag: str = "--contexts") -> torch.Tensor:
    """The last ``context`` tokens of the train, valid and test splits end to end.

    Raises:
        ValueError: if the splits hold fewer tokens.
    """
    text = torch.cat([tokens["train"], tokens["valid"], tokens["test"]])
    check_corpus_holds(text, context, flag)
    return text[-context:]


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


class BenchSetup(NamedTuple):
    """What a bench on reproduce's models starts from: the models (capacity raised, in the decode
    dtype), one prompt a context, and the metrics JSON's provenance fields."""

    target: TargetLM
    head: MTPHead
    prompts: dict[int, torch.Tensor]
    header: dict
    text: torch.Tensor  # the corpus's splits end to end, each context's prompt its last tokens


def bench_setup(kind: str, preset: Preset, dataset_dir: str | None, device: torch.device, seed: int,
                contexts: tuple[int, ...], cache_dir: Path, command: str, progress: bool, log) -> BenchSetup:
    """Load the corpus, tokenizer and reproduce's models (training them if no checkpoint fits), each
    context's prompt (checked before any training), and the header every bench JSON begins with."""
    corpus = data.load_corpus(dataset_dir, max_chars=preset.train.max_train_chars)
    log(corpus.message)
    tokens = tokenizer.corpus_token_splits(corpus, tokenizer.train_tokenizer(corpus, preset.model.vocab_size,
                                                                         cache_dir))
    prompts = {c: long_prompt(tokens, c) for c in contexts}  # every context checked before the training
    text = torch.cat([tokens["train"], tokens["valid"], tokens["test"]])
    target, head, train_info = reproduce.prepare_models(preset, corpus, tokens, seed, device, cache_dir, None,
                                                        progress, log)  # looked up at call time, as tests patch it
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
    return BenchSetup(target, head, prompts, header, text)


def progress_bar(enabled: bool) -> Progress:
    """The benches' rich progress bar (``enabled=False``: silent)."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled)


def row_name(row: dict) -> str:
    """What sets a row apart from the others of its context, for the log: ``, eager loop`` (decode's
    and depth's rows), ``, temperature 0.7`` (sampling's and positions'), or nothing."""
    parts = [f"{row['loop']} loop"] if "loop" in row else []
    if "temperature" in row:
        parts.append(f"temperature {row['temperature']}")
    return "".join(f", {part}" for part in parts)


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
                log(f"context {c}{row_name(row)}: done (row {len(result['rows'])} of the JSON)")
                if on_context is not None:
                    on_context(result)
    result["complete"] = True
    return result


def add_model_arguments(p) -> None:
    """The options every bench on reproduce's models shares (bench decode's, bench sampling's)."""
    from .cli import DEFAULT_PRESET, seed_arg

    p.add_argument("--device", default="auto", help="cpu, mps, cuda or auto (default: auto)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per run (default: the preset's)")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"named preset (default: {DEFAULT_PRESET}, reproduce's models; another goes into --out's "
                        "default name)")
    p.add_argument("--dataset-dir", default=None, help="as reproduce's (default: none: the hub if online, else the "
                   "offline corpus python-stdlib)")
    p.add_argument("--seed", type=seed_arg, default=42, help="the models' seed, as reproduce's (default: 42)")
    p.add_argument("--cache-dir", type=Path, default=Path(".wmtp-cache"),
                   help="tokenizer and checkpoint cache, shared with reproduce (default: .wmtp-cache)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_keysets_argument(p, gates: bool = True) -> None:
    """``--keysets``: the draft arms of a bench that runs the native arm beside them (decode, depth, sampling;
    batch with ``gates=False``, whose decoders take no gate)."""
    forms = (", or 8:64@8192 (native up to a context of 8192 tokens, 8+64 past it)" if gates
             else " (no @GATE: the batch decoders take none)")
    p.add_argument("--keysets", nargs="+", default=None, metavar="SINK:WINDOW[@GATE]" if gates else "SINK:WINDOW",
                   help=f"windowed draft arms, e.g. 64:4096 8:64{forms}; the native arm always runs "
                        "(default: the preset's)")


def model_options(args) -> tuple[torch.device, Preset, str]:
    """``add_model_arguments``' options checked: the device, the preset (``--new-tokens`` and any
    ``--keysets`` applied, the native arm first) and the device's name in default file names
    (``h200``, ``cuda``, ``cpu`` or ``mps``)."""
    from .config import KeySetConfig, get_preset, parse_keyset
    from .device import resolve_device

    device = resolve_device(args.device)
    if any(c < 2 for c in args.contexts):
        raise ValueError(f"--contexts must be at least 2, got {' '.join(map(str, args.contexts))}")
    if args.new_tokens is not None and args.new_tokens < 2:
        raise ValueError(f"--new-tokens must be at least 2, got {args.new_tokens}")
    preset = get_preset(args.preset)
    if args.new_tokens is not None:
        preset = dataclasses.replace(preset, spec=dataclasses.replace(preset.spec, new_tokens=args.new_tokens))
    if getattr(args, "keysets", None):
        keysets = (KeySetConfig(0, None), *map(parse_keyset, args.keysets))
        preset = dataclasses.replace(preset, spec=dataclasses.replace(preset.spec, keysets=keysets))
    slug = device.type if device.type != "cuda" else (
        "h200" if "H200" in torch.cuda.get_device_name(device) else "cuda")
    return device, preset, slug


def default_out(name: str, preset: str, slug: str) -> Path:
    """``metrics/bench-<name>-<slug>.json`` for the default preset (the committed results); another
    preset goes into the name, ``metrics/bench-<name>-<preset>-<slug>.json``, so that a quick
    ``--preset tiny`` never overwrites them, even stopped halfway. Unlike reproduce's
    ``_default_out``, the corpus, the seed and overrides such as ``--contexts`` are not in the name:
    such a run of the default preset rewrites the committed file unless ``--out`` is given."""
    from .cli import DEFAULT_PRESET

    return Path("metrics") / f"bench-{name}{'' if preset == DEFAULT_PRESET else '-' + preset}-{slug}.json"


def out_help(name: str) -> str:
    """``--out``'s default, as each bench's help states it."""
    from .cli import DEFAULT_PRESET

    return (f"(default: metrics/bench-{name}-<h200|cuda|cpu|mps>.json; another --preset than {DEFAULT_PRESET} "
            f"goes into the name: metrics/bench-{name}-<preset>-<h200|cuda|cpu|mps>.json)")


def bench_cli(args, prog: str, argv: list[str], name: str, slug: str, run: Callable, table: Callable,
              plot: bool = False) -> int:
    """What every ``wmtp bench`` on reproduce's models does once its own options are checked: the
    output (``--out``, default ``default_out(name, args.preset, slug)``; with ``plot`` its PNG beside
    it) checked writable, then ``run(command, log, on_context)`` (the bench, logging to stderr and writing
    the JSON so far after every row), the final JSON, the plot and a rich table."""

    from rich.console import Console

    from .fileio import check_cache_dir, check_distinct, check_writable
    from .metrics import command_line, write_json

    if len(set(args.contexts)) < len(args.contexts):
        raise ValueError(f"--contexts must each be given once, got {args.contexts}")
    out = args.out or default_out(name, args.preset, slug)
    check_writable(out, "--out")
    if plot:
        check_writable(out.with_suffix(".png"), "--out's plot")
        check_distinct(out, out.with_suffix(".png"), "--out", "its plot")
    check_cache_dir(args.cache_dir, {"--out": out, "--out's plot": out.with_suffix(".png") if plot else None})
    err = Console(stderr=True)

    def log(line: str) -> None:
        err.print(line, markup=False, highlight=False, soft_wrap=True)

    result = run(command_line(prog, argv), log, lambda partial: write_json(out, partial))
    write_json(out, result)
    wrote = str(out)
    if plot:
        from .plots import render

        wrote += f" and {render(out)}"
    Console(width=200).print(table(result))
    log(f"wrote {wrote} in {result['wall_time_s']:.0f} s")
    return 0
