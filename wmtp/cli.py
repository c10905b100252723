"""The ``wmtp`` command (and its ``auto-research`` alias): ``build_parser()`` + ``main(argv) -> int``.

Subcommands: ``reproduce`` (train or load the models, run every arm, assert losslessness, write
the metrics JSON; arXiv 2607.21535, Sec. 4, in miniature; wmtp/reproduce_cli.py), ``bench attention``
(draft-attention time per key set and context), ``bench decode`` (end-to-end decoding, eager and
CUDA-graph loops; wmtp/bench_decode.py), ``bench sampling`` (acceptance of sampled speculative
decoding per key set, temperature and method; wmtp/bench_sampling.py), ``bench depth`` (measured
time per token per key set and draft-depth policy; wmtp/bench_depth.py), ``bench positions``
(acceptance with absolute and re-indexed draft key positions; wmtp/bench_positions.py), ``bench
batch`` (batches of prompts: the dense batch, lockstep and a position a row; wmtp/bench_batch.py),
``generate`` (text with the accepted drafts marked; wmtp/generate_cli.py), ``grade`` and ``plot``.
Bad input exits with status 2 and one line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

from rich.console import Console

from . import __version__
from .checks import SEED_LIMIT
from .fileio import check_distinct, check_writable

DEFAULT_PRESET = "small"  # reproduce's and bench's --preset; its results are the committed metrics files

# `wmtp bench NAME` on reproduce's models: wmtp/bench_NAME.py's add_arguments and cli; (help, description)
BENCHES = {
    "decode": ("end-to-end decoding per context: eager and CUDA-graph loops",
               "Decode with dense greedy and every draft arm of reproduce's models at long contexts, in the eager "
               "loop and (on CUDA) the CUDA-graph loop; assert every arm lossless; write per-step draft and verify "
               "times, AL and TPOT as JSON."),
    "sampling": ("acceptance of sampled speculative decoding per key set and method",
                 "Sample with dense decoding and every draft arm of reproduce's models at each context and "
                 "temperature, verified by rejection sampling and by shared Gumbel noise; assert every gumbel arm "
                 "token-equal to dense sampling; write AL, acceptance and accept-length histograms as JSON."),
    "depth": ("time per token per key set and draft-depth policy",
              "Decode greedily with dense decoding and every draft arm of reproduce's models at each context, "
              "drafting fixed depths and the two adaptive depth policies; assert every run lossless; write the mean "
              "drafted depth, AL and the measured time per token kept (TPOT) as JSON."),
    "batch": ("batches of prompts: the dense batch, lockstep and a position a row",
              "Decode batches of prompts of one length and of mixed lengths with reproduce's models: the dense "
              "batch, lockstep speculative batches and batches with a position a row, for every key set; assert "
              "every run token-equal to the dense batch; write the time per token a row, AL and speedups as JSON."),
    "positions": ("acceptance with absolute and with re-indexed draft key positions",
                  "Decode with every windowed key set of reproduce's models at each context and temperature, its "
                  "draft keys at their absolute positions and re-indexed (StreamingLLM); assert every run "
                  "token-equal to dense decoding; write AL and acceptance of both as JSON."),
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits 2, and reads any word that starts with
    ``-`` and a digit as a value: ``--keysets -1:64`` then says what is wrong with the key set, where
    argparse, which takes only plain negative numbers as values, read ``-1:64`` as an unknown option
    and said ``--keysets`` expected an argument."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")  # no option of wmtp's starts so

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("the following arguments are required"):  # a bare `wmtp` or `wmtp bench`, say
            message += f" (see `{self.prog} --help`)"
        self.exit(2, f"{self.prog}: error: {message}\n")


def seed_arg(text: str) -> int:
    """``--seed``'s type: an integer from 0 to 2**64 - 1, the library's range (``checks.check_seed``:
    what ``torch.Generator.manual_seed`` takes, less the negative seeds it reads as their 2**64 complement)."""
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if not 0 <= seed < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2**64 - 1, got {text!r}")
    return seed


def build_parser(prog: str = "wmtp") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Windowed-MTP: speculative decoding whose MTP draft head reads only "
                     "attention sinks and a recent window, verified losslessly by the full-attention target.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    importlib.import_module(".reproduce_cli", __package__).add_arguments(sub.add_parser(
        "reproduce", help="train (or load) the models, run all arms, write metrics JSON",
        description="Reproduce Windowed-MTP: train the target LM and MTP head on the CPU (or load the cached "
                    "checkpoint), decode on --device at each context with the native and windowed draft arms, "
                    "assert every arm equals dense greedy decoding, and write metrics/*.json."))

    bench = sub.add_parser("bench", help="benchmarks", description="Benchmarks; figures are medians of repeats.")
    bench_sub = bench.add_subparsers(dest="bench", required=True, parser_class=_Parser)
    att = bench_sub.add_parser("attention", help="attention time per kernel, key set and context",
                               description="On CUDA: time wmtp's Triton kernels (windowed draft, full verify; "
                               "contiguous and paged cache) next to SDPA, gather+SDPA, compact SDPA and FlexAttention "
                               "at contexts up to 1M, against the HBM floor; write JSON and a plot. Elsewhere: time "
                               "one draft query with the preset's native and windowed key sets, side by side.")
    att.add_argument("--device", default="auto", help="cpu, mps, cuda or auto (default: auto)")
    att.add_argument("--preset", default=DEFAULT_PRESET,
                     help="(CPU/MPS) preset whose head shapes and key sets are used")
    att.add_argument("--contexts", type=int, nargs="+", default=None,
                     help="cache lengths S (default: 16384 131072 524288 1048576 on CUDA, 1024 4096 16384 elsewhere)")
    att.add_argument("--repeats", type=int, default=None,
                     help="(CPU/MPS) timed repeats per cell, median reported (default: 100)")
    att.add_argument("--rep-ms", type=int, default=None, help="(CUDA) do_bench measuring time per cell, in ms "
                     "(default: 100)")
    att.add_argument("--methods", nargs="+", default=None, help="(CUDA) methods to time (default: all)")
    att.add_argument("--batch", type=int, default=None, help="(CUDA) sequences per call, each of S keys (default: 1, "
                     "the bars of docs/results/gpu-attention.md; another batch writes "
                     "metrics/bench-attention-<h200|cuda>-b<batch>.json)")
    att.add_argument("--dtype", choices=("float32", "float64", "float16", "bfloat16"), default=None,
                     help="default: bfloat16 on CUDA, float32 elsewhere")
    att.add_argument("--out", type=Path, default=None,
                     help="write the JSON here (CUDA default: metrics/bench-attention-<h200|cuda>.json at batch 1)")
    att.add_argument("--plot", type=Path, default=None, help="(CUDA) write the plot here (default: --out as .png)")

    for name, (help_, description) in BENCHES.items():  # each module's add_arguments and cli
        importlib.import_module(f".bench_{name}", __package__).add_arguments(
            bench_sub.add_parser(name, help=help_, description=description))
    from .grading import ASSIGNMENTS

    grade = sub.add_parser("grade", help="grade a course assignment against the library's oracles",
                           description="Import the student's file, check its function against wmtp's oracles "
                           "(literal cases, fuzzed cases and, for most, a simulation such as greedy_verify's "
                           "oracle-draft lossless harness) "
                           "and print the first failing case. Exit 0 if it passes, 1 if not, 2 on bad input.")
    grade.add_argument("assignment", choices=tuple(ASSIGNMENTS),
                       help="which assignment (tutorials/assignments/)")
    grade.add_argument("path", type=Path, help="the student's .py file")

    importlib.import_module(".generate_cli", __package__).add_arguments(sub.add_parser(
        "generate", help="generate text with speculative decoding, the accepted drafts highlighted",
        description="Load (or train) reproduce's models, decode the prompt greedily with the MTP draft "
                    "reading one key set, print the text with the head's accepted drafts highlighted and the "
                    "run's counters, and check the output equals dense greedy decoding (exit 1 if not)."))

    plot = sub.add_parser("plot", help="draw a metrics JSON of reproduce or any bench command as a PNG",
                          description="Render a metrics file written by 'wmtp reproduce' or 'wmtp bench' (attention, "
                                      "decode, depth, sampling, positions or batch).")
    plot.add_argument("json", type=Path, help="the metrics JSON")
    plot.add_argument("--out", type=Path, default=None, help="PNG path (default: the JSON's name with .png)")
    return parser


def stdout_console() -> Console:
    """A rich console on stdout; 160 columns when stdout is not a terminal (a pipe or a log), where
    rich would squeeze tables to 80 and cut their headers."""
    return Console(width=None if sys.stdout.isatty() else 160)


def _grade(args: argparse.Namespace) -> int:
    from .grading import grade

    report = grade(args.assignment, args.path)
    Console().print(str(report), style="green" if report.passed else "red", markup=False, highlight=False,
                    soft_wrap=True)
    return 0 if report.passed else 1


def main(argv: list[str] | None = None, prog: str = "wmtp") -> int:
    """Run the command line; return the exit status (2 for bad input)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args, unknown = build_parser(prog).parse_known_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return int(e.code or 0)
    if unknown:  # parse_args would name the top command, "wmtp: error:", for a subcommand's unknown option
        print(f"{_where(prog, args)}: error: unrecognized arguments: {' '.join(unknown)}", file=sys.stderr)
        return 2
    try:
        if args.command == "reproduce":
            return importlib.import_module(".reproduce_cli", __package__).cli(args, prog, argv)
        if args.command == "grade":
            return _grade(args)
        if args.command == "generate":
            return importlib.import_module(".generate_cli", __package__).cli(args, prog, argv)
        if args.command == "plot":
            from .plots import render

            if args.json.is_dir():
                raise ValueError(f"metrics file {str(args.json)!r} is a folder: pass a JSON file's path")
            if args.out:
                check_writable(args.out, "--out")
                if args.out.suffix.lower() != ".png":
                    raise ValueError(f"--out {args.out}: the plot is a PNG, name it .png")
            check_distinct(args.json, args.out or args.json.with_suffix(".png"), "the metrics file", "the plot")
            print(f"wrote {render(args.json, args.out)}")
            return 0
        if args.bench in BENCHES:
            return importlib.import_module(f".bench_{args.bench}", __package__).cli(args, prog, argv)
        from .bench import attention_cli

        return attention_cli(args, prog, argv)
    except (ValueError, OSError) as e:  # bad input, or a path that cannot be read or written: one line
        print(f"{_where(prog, args)}: error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:  # a size the machine cannot hold: one line; any other error raises
        if not _out_of_memory(e):
            raise
        what = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"{_where(prog, args)}: error: out of memory ({what}): ask for less (contexts, new tokens, batch sizes, "
              "page size)", file=sys.stderr)
        return 2


def _where(prog: str, args: argparse.Namespace) -> str:
    """The command an error names, as argparse names its own usage errors: ``wmtp bench decode``."""
    return " ".join([prog, args.command] + ([args.bench] if args.command == "bench" else []))


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed: Python's, the CPU allocator's or CUDA's."""
    import torch

    return (isinstance(e, (MemoryError, torch.OutOfMemoryError))
            or "can't allocate memory" in str(e) or "out of memory" in str(e).lower())


def auto_research_main(argv: list[str] | None = None) -> int:
    """``auto-research``: the same command line (``auto-research reproduce --paper windowed-mtp ...``)."""
    return main(argv, prog="auto-research")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
