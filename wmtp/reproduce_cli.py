"""``wmtp reproduce``: train (or load) the models, decode every arm at each context, assert each
arm lossless and write the metrics JSON and its plot (wmtp/reproduce.py; arXiv 2607.21535,
Sec. 4, in miniature). Its options, their checks before any work (the preset's overrides, the
output paths, the checkpoint), the default ``--out``'s name and the printed tables.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .cli import DEFAULT_PRESET, seed_arg, stdout_console
from .fileio import check_cache_dir, check_distinct, check_writable

__all__ = ["PAPERS", "add_arguments", "cli"]

PAPERS = ("windowed-mtp",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``wmtp reproduce``'s options (wmtp/cli.py builds the parser)."""
    p.add_argument("--paper", choices=PAPERS, default="windowed-mtp", help="which paper to reproduce")
    p.add_argument("--dataset-dir", default=None, help="folder holding WikiText-2 (any of its layouts); "
                   "without WikiText there, the hub is tried when online, else the offline corpus python-stdlib")
    p.add_argument("--device", default="auto",
                   help="cpu, mps, cuda or auto (default: auto); where the models evaluate and decode "
                        "(training runs on the CPU, so every device decodes the same weights)")
    p.add_argument("--seed", type=seed_arg, default=42, help="seed of weights and batches (default: 42)")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"named preset from wmtp.PRESETS (default: {DEFAULT_PRESET}; tiny: a smoke test of "
                        "seconds whose numbers mean nothing)")
    p.add_argument("--out", type=Path, default=None,
                   help="metrics JSON path (default: metrics/<corpus>-seed<seed>.json for the preset small, "
                        "as it is, on the CPU; another preset adds -<preset> after the corpus, overrides of "
                        "the preset -<preset>-custom, another device -<device> at the end)")
    p.add_argument("--cache-dir", type=Path, default=Path(".wmtp-cache"),
                   help="tokenizer and checkpoint cache (default: .wmtp-cache)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint to load, or to write after training (default: in the cache dir)")
    p.add_argument("--depth", type=int, default=None, help="draft tokens per step K (default: the preset's)")
    p.add_argument("--keysets", nargs="+", default=None, metavar="SINK:WINDOW[@GATE]",
                   help="windowed draft arms, e.g. 64:4096 8:64, or 8:64@8192 (native up to a context of 8192 "
                        "tokens); the native arm always runs (default: preset's)")
    p.add_argument("--contexts", type=int, nargs="+", default=None, help="prompt lengths (default: preset's)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per arm (default: preset's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _print_reproduce(console: Console, m: dict) -> None:
    table = Table(title=f"Windowed-MTP reproduction: {m['corpus']['name']}, preset {m['config']['preset']}, "
                  f"depth {m['config']['spec']['depth']}, decode {m['decode_dtype']}")  # tiny's numbers mean nothing
    for col in ("context", "arm", "draft keys/step", "accept", "AL", "draft ms/step", "verify ms/step", "TPOT ms",
                "TPOT speedup vs dense", "lossless"):
        table.add_column(col, justify="right")
    for c in m["contexts"]:
        table.add_row(str(c["context"]), "dense", "-", "-", "1.00", "-", f"{c['dense']['step_median_s'] * 1e3:.2f}",
                      f"{c['dense']['tpot_s'] * 1e3:.2f}", "-", "-")
        for name, a in c["arms"].items():
            table.add_row("", name, f"{a['draft_keys_read_per_step']:.0f}", f"{a['acceptance_rate']:.2f}",
                          f"{a['mean_accept_length']:.2f}", f"{a['draft_time_per_step_s'] * 1e3:.2f}",
                          f"{a['verify_time_per_step_s'] * 1e3:.2f}", f"{a['tpot_s'] * 1e3:.2f}",
                          f"{a['tpot_speedup_vs_dense']:+.0%}", "yes" if a["lossless"] else "NO")
    console.print(table)
    from .bench import attention_table

    console.print(attention_table(m["draft_attention"]))
    ppl = m["target_perplexity"]
    by_context = ", ".join(f"{c}: {p:.2f}" for c, p in ppl["by_context"].items())  # the JSON keeps every digit
    console.print(f"target perplexity on {ppl['valid_tokens_scored']} valid tokens, by context: {by_context}")


def _preset_with_overrides(args: argparse.Namespace):
    """The named preset with the command line's overrides, validated before any work starts."""
    from dataclasses import replace

    from .config import KeySetConfig, get_preset, parse_keyset

    preset = get_preset(args.preset)
    spec = preset.spec
    contexts = spec.contexts if args.contexts is None else tuple(args.contexts)
    new_tokens = spec.new_tokens if args.new_tokens is None else args.new_tokens
    if any(c < 1 for c in contexts):  # before SpecConfig's own check, which names no flag
        raise ValueError(f"--contexts must be positive, got {' '.join(map(str, contexts))}")
    if new_tokens < 2:
        raise ValueError(f"--new-tokens must be at least 2 (one decode step to time), got {new_tokens}")
    if args.depth is not None:
        spec = replace(spec, depth=args.depth)
    if args.keysets is not None:
        spec = replace(spec, keysets=(KeySetConfig(0, None), *map(parse_keyset, args.keysets)))
    spec = replace(spec, contexts=contexts, new_tokens=new_tokens)
    longest = max(spec.contexts) + spec.new_tokens + spec.depth - 1  # as speculative_generate reserves
    if longest > preset.model.max_seq_len:
        raise ValueError(f"a prompt of {max(spec.contexts)} tokens plus {spec.new_tokens} new tokens and depth "
                         f"{spec.depth} needs {longest} cache positions; the KV cache holds {preset.model.max_seq_len}")
    return replace(preset, spec=spec)


def _default_out(corpus: str, preset: str, custom: bool, seed: int, device: str) -> Path:
    """``metrics/<corpus>-seed<seed>.json`` for the default preset as it is, on the CPU (the
    committed results). Another preset, overrides of it (``custom``) and another device go into
    the name, so that neither a quick ``--preset tiny``, nor ``--contexts 64``, nor a GPU or MPS
    run overwrites them."""
    tag = "" if preset == DEFAULT_PRESET and not custom else f"-{preset}{'-custom' if custom else ''}"
    return Path("metrics") / f"{corpus}{tag}-seed{seed}{'' if device == 'cpu' else '-' + device}.json"


def cli(args: argparse.Namespace, prog: str, argv: list[str]) -> int:
    """Run ``wmtp reproduce``: check every option and path, then train or load, decode, write and print."""
    from .config import get_preset
    from .device import resolve_device
    from .metrics import command_line, write_json
    from .reproduce import reproduce

    preset, device = _preset_with_overrides(args), resolve_device(args.device)
    name = (args.preset, preset != get_preset(args.preset), args.seed, device.type)  # the default --out's parts
    new_checkpoint = args.checkpoint if args.checkpoint is not None and not args.checkpoint.exists() else None
    if args.checkpoint is not None and args.checkpoint.is_dir():
        raise ValueError(f"--checkpoint {args.checkpoint} is a folder: pass the checkpoint file's path")
    out = args.out or _default_out("*", *name)  # the default's name waits for the corpus's
    png = out.with_suffix(".png")
    for path, what in ((out, "--out"), (png, "--out's plot"), (new_checkpoint, "--checkpoint")):
        if path is not None:  # fail now, not after the training and decoding
            check_writable(path, what)
    check_cache_dir(args.cache_dir, {"--out": out, "--out's plot": png})
    check_distinct(out, png, "--out", "its plot")
    for path, what in ((out, "--out"), (png, "--out's plot")):  # the default's "*": any corpus's name
        pattern = glob.escape(str(path.resolve())).replace("[*]", "*")
        if args.checkpoint is not None and fnmatch.fnmatchcase(str(args.checkpoint.resolve()), pattern):
            raise ValueError(f"--checkpoint {args.checkpoint} would be overwritten by {what} {path}: give them "
                             "two names")
    console = Console(stderr=True)
    command = command_line(prog, argv)

    def log(line: str) -> None:  # one plain line each, never re-wrapped or styled
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    m = reproduce(preset, args.dataset_dir, device, args.seed, None, args.cache_dir, args.checkpoint, command,
                  progress=not args.no_progress, log=log)
    out = args.out or _default_out(m["corpus"]["name"], *name)
    write_json(out, m)
    from .plots import render

    png = render(out)
    _print_reproduce(stdout_console(), m)
    log(f"wrote {out} and {png} in {m['wall_time_s']:.0f} s")  # a path is no markup: [/x] raised a MarkupError
    return 0
