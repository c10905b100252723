"""``wmtp bench sampling``: acceptance of sampled speculative decoding per draft key set,
temperature and verification method (beyond arXiv 2607.21535, which verifies greedily, Sec. 2, and
reports greedy acceptance, Sec. 4; its window changes only the draft, Sec. 3, so it works with
sampling too: wmtp/sampling.py).

For each context and each temperature: dense sampled decoding (``sample_generate``), then every key
set of the preset's ``SpecConfig`` (native first) with each method of ``speculative_sample``:
``"rejection"`` (speculative sampling, equal to dense sampling in distribution) and ``"gumbel"``
(equal to dense sampling with the same seed token for token). Every gumbel arm's output is asserted
equal (``torch.equal``) to the dense sample before anything is kept. Every run at a context starts
from ONE prefill of its prompt (``prefill_prompt``, wmtp/prefill.py). The figures are acceptance,
not time: AL (tokens per target pass), the acceptance rate, the accept-length histogram and the
acceptance per draft position, pooled over the runs of several sample seeds (one run of 128 tokens
is a few dozen steps: a single seed's AL moves by tens of percent), with each seed's AL beside them;
a windowed arm's pooled AL is compared with the native arm's at the same context, temperature and
method.

The models and the prompt are ``wmtp bench decode``'s (wmtp/bench_decode.py): reproduce's
checkpoint with the KV-cache capacity raised to the longest context, and the last ``context``
tokens of the corpus's splits end to end. Acceptance is this small model's, on this text.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .bench_common import (
    add_keysets_argument,
    add_model_arguments,
    bench_cli,
    bench_setup,
    model_options,
    out_help,
    run_contexts,
)
from .config import Preset
from .model import TargetLM
from .mtp import MTPHead
from .plots import SAMPLING_KIND
from .prefill import Prefill
from .sampling import METHODS, MIN_TEMPERATURE, check_sampling, sample_generate, speculative_sample
from .stats import SpecStats

LOSSLESS = {"rejection": "in distribution (rejection sampling)", "gumbel": "token-equal to dense sampling"}


def check_temperatures(temperatures: tuple[float, ...], seeds: tuple[int, ...]) -> None:
    """Refuse (``ValueError``) a temperature that is negative, not finite or repeated, or bad or repeated
    sample seeds (a repeated temperature ran its rows twice, as no other list option of a bench does)."""
    if not temperatures or not seeds:
        raise ValueError("--temperatures and --sample-seeds need at least one value each")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--sample-seeds must be distinct, got {list(seeds)}")
    if len(set(temperatures)) != len(temperatures):
        raise ValueError(f"--temperatures must be distinct, got {list(temperatures)}")
    for t in temperatures:
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"--temperatures must be finite and >= 0, got {t}")
        for seed in seeds:
            check_sampling(t, seed)


def pooled(runs: list[SpecStats]) -> SpecStats:
    """One ``SpecStats`` counting every step of ``runs`` (times left out)."""
    total = SpecStats(depth=runs[0].depth)
    for r in runs:
        for key in ("proposed", "accepted", "committed", "steps"):
            setattr(total, key, getattr(total, key) + getattr(r, key))
        total.accept_length_histogram = [a + b for a, b in zip(total.accept_length_histogram,
                                                                r.accept_length_histogram)]
        total.per_position_accepted = [a + b for a, b in zip(total.per_position_accepted, r.per_position_accepted)]
    return total


def run_context(target: TargetLM, head: MTPHead, prompt: torch.Tensor, preset: Preset, temperature: float,
                seeds: tuple[int, ...], prefill: Prefill, on_run: Callable[[str], object] = lambda what: None) -> dict:
    """Dense sampling per seed, then every (arm, method) with every seed, each run from ``prefill``;
    every gumbel run asserted token-equal to the dense sample of its seed before anything is kept.
    ``on_run`` hears each run's name."""
    spec = preset.spec
    dense = {}
    for seed in seeds:
        dense[seed] = sample_generate(target, prompt, spec.new_tokens, temperature, seed, prefill=prefill)
        on_run(f"dense, seed {seed}")
    row = {"context": prompt.numel(), "temperature": temperature, "new_tokens": spec.new_tokens, "arms": {}}
    native_al: dict[str, float] = {}
    for ks in sorted(spec.keysets, key=lambda c: c.window is not None):  # native first: the baseline
        methods = {}
        for method in METHODS:
            runs = []
            for seed in seeds:
                out, stats = speculative_sample(target, head, prompt, spec.new_tokens, spec.depth, ks.n_sink,
                                                ks.window, temperature=temperature, seed=seed, method=method,
                                                prefill=prefill, gate=ks.gate)
                if method == "gumbel" and not torch.equal(out, dense[seed]):
                    raise AssertionError(f"arm {ks.label} (gumbel) at context {prompt.numel()}, temperature "
                                         f"{temperature}, seed {seed} is not token-equal to dense sampling")
                runs.append(stats)
                on_run(f"{ks.label} {method}, seed {seed}")
            stats = pooled(runs)
            al = stats.mean_accept_length
            native_al.setdefault(method, al)  # the native arm runs first
            methods[method] = {
                "lossless": LOSSLESS[method], "steps": stats.steps, "proposed": stats.proposed,
                "accepted": stats.accepted, "acceptance_rate": stats.acceptance_rate, "mean_accept_length": al,
                "mean_accept_length_per_seed": [r.mean_accept_length for r in runs],
                "accept_length_histogram": stats.accept_length_histogram,
                "per_position_acceptance": stats.per_position_acceptance,
                "mean_accept_length_change_vs_native": None if ks.window is None else al / native_al[method] - 1,
            }
        row["arms"][ks.label] = {"n_sink": ks.n_sink, "window": ks.window, "gate": ks.gate, "methods": methods}
    return row


def bench_sampling(preset: Preset, dataset_dir: str | None, device: torch.device, seed: int,
                   contexts: tuple[int, ...], temperatures: tuple[float, ...], sample_seeds: tuple[int, ...],
                   cache_dir: Path,
                   command: str, progress: bool = False, log=print,
                   on_context: Callable[[dict], object] | None = None) -> dict:
    """Load (or train) reproduce's models, then ``run_context`` for every context and temperature.

    ``seed`` is the models' (as reproduce's); ``sample_seeds`` the sampling noise's, one run each. ``on_context``
    gets the metrics so far after each (context, temperature), to write a partial file.

    Raises:
        ValueError: for a bad temperature or sample seed, or a context the corpus cannot fill.
    """
    check_temperatures(temperatures, sample_seeds)
    t_start = time.perf_counter()
    setup = bench_setup(SAMPLING_KIND, preset, dataset_dir, device, seed, contexts, cache_dir, command, progress, log)
    result = {
        **setup.header,
        "sample_seeds": list(sample_seeds), "temperatures": list(temperatures), "methods": list(METHODS),
        "lossless": "asserted: every gumbel arm's tokens equal dense sampling's with the same seed (torch.equal); "
                    "rejection arms are equal to it in distribution",
        "rows": [], "complete": False,
    }
    runs = len(sample_seeds) * (1 + len(preset.spec.keysets) * len(METHODS))  # dense, then every (arm, method)

    def rows(prompt, pre, tick):
        for temp in temperatures:
            yield run_context(setup.target, setup.head, prompt, preset, temp, sample_seeds, pre,
                              lambda what, temp=temp: tick(f"temperature {temp}: {what}"))

    return run_contexts("bench sampling", setup, preset, device, contexts, len(temperatures) * runs, rows, result,
                        t_start, progress, log, on_context)


def table(result: dict):
    """A rich table: one line per (context, temperature, arm, method), native first."""
    from rich.table import Table

    env = result["environment"]
    t = Table(title=f"wmtp bench sampling ({env.get('device_name', env['device'])}, {result['decode_dtype']}, "
                    f"depth {result['config']['spec']['depth']}, sample seeds {result['sample_seeds']} pooled)")
    for col in ("context", "temperature", "arm", "method", "AL", "AL per seed", "acceptance", "AL change vs native"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        first = True
        for label, arm in r["arms"].items():
            for method, m in arm["methods"].items():
                change = m["mean_accept_length_change_vs_native"]
                per_seed = " ".join(f"{al:.2f}" for al in m["mean_accept_length_per_seed"])
                t.add_row(str(r["context"]) if first else "", f"{r['temperature']:g}" if first else "", label, method,
                          f"{m['mean_accept_length']:.2f}", per_seed, f"{m['acceptance_rate']:.1%}",
                          "-" if change is None else f"{change:+.1%}")
                first = False
    return t


def add_arguments(p) -> None:
    """``wmtp bench sampling``'s options (wmtp/cli.py builds the parser)."""
    from .cli import seed_arg  # --seed's type: a bad seed's one-line error names --sample-seeds

    add_model_arguments(p)
    add_keysets_argument(p)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 16384],
                   help="prompt lengths (default: 1024 16384)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0],
                   help=f"sampling temperatures, 0 (greedy) or >= {MIN_TEMPERATURE} (default: 0.7 1.0)")
    p.add_argument("--sample-seeds", type=seed_arg, nargs="+", default=[0, 1, 2, 3],
                   help="seeds of the sampling noise, one run each, pooled (default: 0 1 2 3)")
    p.add_argument("--out", type=Path, default=None,
                   help="write the JSON here and its plot beside it " + out_help("sampling"))


def cli(args, prog: str, argv: list[str]) -> int:
    """Run ``wmtp bench sampling``: check the options, write the JSON after every row, print a table."""
    device, preset, slug = model_options(args)
    check_temperatures(tuple(args.temperatures), tuple(args.sample_seeds))
    return bench_cli(args, prog, argv, "sampling", slug, lambda command, log, on_context: bench_sampling(
        preset, args.dataset_dir, device, args.seed, tuple(args.contexts), tuple(args.temperatures),
        tuple(args.sample_seeds), args.cache_dir, command, progress=not args.no_progress, log=log,
        on_context=on_context), table, plot=True)
