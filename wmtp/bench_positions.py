"""``wmtp bench positions``: acceptance of the windowed draft with absolute and with re-indexed key
positions (beyond arXiv 2607.21535, whose draft keys keep their absolute positions, Sec. 3;
re-indexing is StreamingLLM's choice: wmtp/keyset.py).

A windowed draft that evicts keys sees its sinks at a distance of the whole context, far past the
distances a head trained on short sequences met; re-indexed, no distance exceeds
``n_sink + window - 1``. Which drafts better is an empirical question this bench answers for
reproduce's models.

For each context and temperature: every windowed key set of ``--keysets`` with both positions,
decoding with ``speculative_sample(..., method="gumbel")`` (temperature 0: greedy, one run) over
each sample seed. Every run's tokens are asserted equal (``torch.equal``) to dense decoding with the
same seed, so the two positions are judged on the same output: a paired comparison, in which only
the drafts differ. Figures: AL (tokens per target pass), acceptance and the acceptance per draft
position, pooled over the seeds, each seed's AL beside them, and the change of the re-indexed AL
against the absolute one. Every run at a context starts from ONE prefill of its prompt
(wmtp/prefill.py: the draft's KV does not depend on its positions' option, only its queries do).

The models and the prompt are ``wmtp bench decode``'s (wmtp/bench_decode.py). Acceptance is this
small model's, on this text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from .bench_common import add_model_arguments, bench_cli, bench_setup, model_options, out_help, run_contexts
from .bench_sampling import check_temperatures, pooled
from .config import KeySetConfig, Preset, parse_keyset
from .keyset import POSITIONS
from .model import TargetLM
from .mtp import MTPHead
from .plots import POSITIONS_KIND
from .prefill import Prefill
from .sampling import MIN_TEMPERATURE, sample_generate, speculative_sample


def run_context(target: TargetLM, head: MTPHead, prompt: torch.Tensor, preset: Preset,
                keysets: tuple[KeySetConfig, ...], temperature: float, seeds: tuple[int, ...], prefill: Prefill,
                on_run: Callable[[str], object] = lambda what: None) -> dict:
    """Dense decoding per seed, then every (key set, positions) over the seeds, each run from
    ``prefill`` and asserted token-equal to the dense run of its seed. ``on_run`` hears each run."""
    spec = preset.spec
    seeds = seeds[:1] if temperature == 0 else seeds  # greedy: every seed is the same run
    dense = {}
    for seed in seeds:
        dense[seed] = sample_generate(target, prompt, spec.new_tokens, temperature, seed, prefill=prefill)
        on_run(f"dense, seed {seed}")
    row = {"context": prompt.numel(), "temperature": temperature, "new_tokens": spec.new_tokens,
           "sample_seeds": list(seeds), "arms": {}}
    for ks in keysets:
        # can a draft query sit past the first eviction (its sinks moved when re-indexed)? The last step
        # starts from a committed token before P + new_tokens - 1; its drafts query from the position
        # before that token (the head at t reads h_t and token t + 1) to depth - 2 past it.
        evicts = prompt.numel() + spec.new_tokens + spec.depth - 4 >= ks.n_sink + ks.window
        arm = {"n_sink": ks.n_sink, "window": ks.window, "evicts": evicts, "positions": {}}
        for positions in POSITIONS:
            runs = []
            for seed in seeds:
                out, stats = speculative_sample(target, head, prompt, spec.new_tokens, spec.depth, ks.n_sink,
                                                ks.window, temperature=temperature, seed=seed, method="gumbel",
                                                prefill=prefill, positions=positions)
                if not torch.equal(out, dense[seed]):
                    raise AssertionError(f"{ks.label} ({positions}) at context {prompt.numel()}, temperature "
                                         f"{temperature}, seed {seed} is not token-equal to dense decoding")
                runs.append(stats)
                on_run(f"{ks.label} {positions}, seed {seed}")
            stats = pooled(runs)
            arm["positions"][positions] = {
                "steps": stats.steps, "proposed": stats.proposed, "accepted": stats.accepted,
                "acceptance_rate": stats.acceptance_rate, "mean_accept_length": stats.mean_accept_length,
                "mean_accept_length_per_seed": [r.mean_accept_length for r in runs],
                "accept_length_histogram": stats.accept_length_histogram,
                "per_position_acceptance": stats.per_position_acceptance,
            }
        al = {p: arm["positions"][p]["mean_accept_length"] for p in POSITIONS}
        arm["reindexed_al_change"] = al["reindexed"] / al["absolute"] - 1  # a ratio of ALs, not a time
        row["arms"][ks.label] = arm
    return row


def bench_positions(preset: Preset, dataset_dir: str | None, device: torch.device, seed: int,
                    contexts: tuple[int, ...], keysets: tuple[KeySetConfig, ...], temperatures: tuple[float, ...],
                    sample_seeds: tuple[int, ...], cache_dir: Path, command: str, progress: bool = False, log=print,
                    on_context: Callable[[dict], object] | None = None) -> dict:
    """Load (or train) reproduce's models, then ``run_context`` for every context and temperature.

    Raises:
        ValueError: for no key set, a native or gated one, a bad temperature or seed, or a context the corpus
            cannot fill.
    """
    if not keysets or any(ks.window is None for ks in keysets):
        raise ValueError("--keysets needs windowed key sets (SINK:WINDOW): the native draft has nothing to re-index")
    if any(ks.gate is not None for ks in keysets):
        raise ValueError("--keysets takes ungated key sets (SINK:WINDOW): this study counts evictions from the first "
                         "step on")
    check_temperatures(temperatures, sample_seeds)
    t_start = time.perf_counter()
    setup = bench_setup(POSITIONS_KIND, preset, dataset_dir, device, seed, contexts, cache_dir, command, progress, log)
    result = {
        **setup.header,
        "keysets": [{"n_sink": ks.n_sink, "window": ks.window} for ks in keysets],
        "sample_seeds": list(sample_seeds), "temperatures": list(temperatures), "positions": list(POSITIONS),
        "train_seq_len": preset.train.seq_len,
        "lossless": "asserted: every run's tokens equal dense decoding's with the same seed (torch.equal); "
                    "gumbel verification, greedy at temperature 0",
        "rows": [], "complete": False,
    }
    runs = sum(len(sample_seeds[:1] if t == 0 else sample_seeds) for t in temperatures) * (1 + 2 * len(keysets))

    def rows(prompt, pre, tick):
        for temp in temperatures:
            yield run_context(setup.target, setup.head, prompt, preset, keysets, temp, sample_seeds, pre,
                              lambda what, temp=temp: tick(f"temperature {temp}: {what}"))

    return run_contexts("bench positions", setup, preset, device, contexts, runs, rows, result, t_start, progress, log,
                        on_context)


def table(result: dict):
    """A rich table: one line per (context, temperature, key set)."""
    from rich.table import Table

    env = result["environment"]
    t = Table(title=f"wmtp bench positions ({env.get('device_name', env['device'])}, {result['decode_dtype']}, "
                    f"depth {result['config']['spec']['depth']}, head trained on {result['train_seq_len']} tokens)")
    for col in ("context", "temperature", "key set", "evicts", "AL absolute", "AL re-indexed", "change",
                "acceptance absolute", "acceptance re-indexed"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        first = True
        for label, arm in r["arms"].items():
            a, b = arm["positions"]["absolute"], arm["positions"]["reindexed"]
            t.add_row(str(r["context"]) if first else "", f"{r['temperature']:g}" if first else "", label,
                      "yes" if arm["evicts"] else "no", f"{a['mean_accept_length']:.2f}",
                      f"{b['mean_accept_length']:.2f}", f"{arm['reindexed_al_change']:+.1%}",
                      f"{a['acceptance_rate']:.1%}", f"{b['acceptance_rate']:.1%}")
            first = False
    return t


def add_arguments(p) -> None:
    """``wmtp bench positions``' options (wmtp/cli.py builds the parser)."""
    from .cli import seed_arg  # --seed's type: a bad seed's one-line error names --sample-seeds

    add_model_arguments(p)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384],
                   help="prompt lengths (default: 1024 4096 16384)")
    p.add_argument("--keysets", nargs="+", default=None, metavar="SINK:WINDOW",
                   help="windowed key sets, e.g. 64:4096 8:64 (default: the preset's windowed ones)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0],
                   help=f"temperatures, 0 (greedy, run once) or >= {MIN_TEMPERATURE} (default: 0 1.0)")
    p.add_argument("--sample-seeds", type=seed_arg, nargs="+", default=[0, 1, 2, 3],
                   help="seeds of the sampling noise, one run each, pooled (default: 0 1 2 3)")
    p.add_argument("--out", type=Path, default=None,
                   help="write the JSON here and its plot beside it " + out_help("positions"))


def cli(args, prog: str, argv: list[str]) -> int:
    """Run ``wmtp bench positions``: check the options, write the JSON after every row, print a table."""
    device, preset, slug = model_options(args)
    keysets = tuple(parse_keyset(k) for k in args.keysets) if args.keysets else tuple(
        ks for ks in preset.spec.keysets if ks.window is not None)
    check_temperatures(tuple(args.temperatures), tuple(args.sample_seeds))
    return bench_cli(args, prog, argv, "positions", slug, lambda command, log, on_context: bench_positions(
        preset, args.dataset_dir, device, args.seed, tuple(args.contexts), keysets, tuple(args.temperatures),
        tuple(args.sample_seeds), args.cache_dir, command, progress=not args.no_progress, log=log,
        on_context=on_context), table, plot=True)
