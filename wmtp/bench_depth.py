"""``wmtp bench depth``: measured time per token of greedy speculative decoding per draft key set
and draft-depth policy (beyond arXiv 2607.21535, which drafts a fixed depth, Sec. 4; a policy
trades the accepted tokens of a step against its cost, the paper's step-cost model of Sec. 2:
wmtp/policy.py).

For each context: dense greedy decoding, then every key set of the preset's ``SpecConfig`` (native
first) with each policy: ``FixedDepth(k)`` for every ``k`` of ``--depths`` and ``AdaptiveDepth``
up to the preset's depth, learning its step costs from the measured step times (``learn_costs``)
as a line (``adaptive``) or per depth (``adaptive-per-depth``), a fresh policy per run. Every
run's output is asserted equal (``torch.equal``) to the dense tokens before anything is kept.
Every run at a context starts from ONE prefill of its prompt (``prefill_prompt``,
wmtp/prefill.py). ``loop="eager"`` decodes with wmtp/decode.py's loops, ``loop="graph"`` with
wmtp/static_decode.py's CUDA graphs (one per phase shape met: NOTE [Static depths]), whose
phase times are device times: the adaptive policies then learn their costs from them.

The figure is ``tpot_s``: the measured time per token kept over the whole decode, prefill excluded,
``(sum of the steps' draft and verify seconds) / committed tokens`` (eager: wall-clock phases with a
synchronize, wmtp/decode.py; graph: CUDA events around each replay). Unlike ``wmtp bench decode``'s
median step over AL, it charges every step (the first, and any slow one) to the run, as a policy's
choices do. Dense TPOT is the same for dense decoding: the mean of its one-token steps;
``tpot_speedup_vs_dense = dense TPOT / tpot - 1``. Beside them: the steps drafted at each depth,
the mean drafted depth and AL (tokens committed per target pass).

The models and the prompt are ``wmtp bench decode``'s (wmtp/bench_decode.py): reproduce's
checkpoint with the KV-cache capacity raised to the longest context, and the last ``context``
tokens of the corpus's splits end to end. The depths that pay are this small model's, on this
text and this machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .bench_common import (
    LOOPS,
    add_keysets_argument,
    add_model_arguments,
    bench_cli,
    bench_setup,
    loop_generators,
    model_options,
    out_help,
    run_contexts,
)
from .config import Preset
from .metrics import speedup
from .model import TargetLM
from .mtp import MTPHead
from .plots import DEPTH_KIND
from .policy import AdaptiveDepth, FixedDepth
from .prefill import Prefill

TPOT_NOTE = ("measured time per token kept over the whole decode, prefill excluded: (sum of the steps' draft and "
             "verify seconds) / committed tokens")


def check_options(depths: tuple[int, ...], max_depth: int, rounds: int, loop: str = "eager",
                  device: torch.device | None = None) -> None:
    """Refuse (``ValueError``) no depths, repeated ones, one outside ``[1, max_depth]``, ``rounds``
    below 1, an unknown loop, or the graph loop off CUDA."""
    if loop not in LOOPS:
        raise ValueError(f"--loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if loop == "graph" and device is not None and device.type != "cuda":
        raise ValueError(f"the graph loop captures CUDA graphs; device {device.type} has none (use --loop eager)")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"--rounds must be a positive integer, got {rounds!r}")
    if not depths or len(set(depths)) != len(depths):
        raise ValueError(f"--depths needs at least one value, each once, got {list(depths)}")
    for k in depths:
        if not 1 <= k <= max_depth:
            raise ValueError(f"--depths must be in [1, {max_depth}] (the preset's depth), got {k}")


def policies(depths: tuple[int, ...], max_depth: int) -> dict[str, Callable[[], FixedDepth | AdaptiveDepth]]:
    """Each policy's name and a maker of a fresh one (a policy learns across the runs it is passed to)."""
    makers: dict[str, Callable[[], FixedDepth | AdaptiveDepth]] = {
        f"fixed-{k}": (lambda k=k: FixedDepth(k)) for k in depths}
    makers["adaptive"] = lambda: AdaptiveDepth(max_depth, learn_costs=True)
    makers["adaptive-per-depth"] = lambda: AdaptiveDepth(max_depth, learn_costs=True, cost_model="per-depth")
    return makers


def one_run(target: TargetLM, head: MTPHead, prompt: torch.Tensor, preset: Preset, ks, name: str, policy,
            dense: torch.Tensor, prefill: Prefill, loop: str = "eager") -> dict:
    """One (arm, policy) run from ``prefill`` in ``loop``, asserted token-equal to ``dense`` before it is kept."""
    spec = preset.spec
    described = policy.describe()  # its settings before the run
    out, stats = loop_generators(loop)[1](target, head, prompt, spec.new_tokens, policy, ks.n_sink, ks.window,
                                          prefill=prefill, gate=ks.gate)
    if not torch.equal(out, dense):
        raise AssertionError(f"arm {ks.label} with policy {name} at context {prompt.numel()} is not "
                             f"token-equal to dense greedy decoding")
    draft_s, verify_s = sum(stats.draft_times_s), sum(stats.verify_times_s)
    run = {"policy": described, "steps": stats.steps, "committed": stats.committed, "proposed": stats.proposed,
           "accepted": stats.accepted, "acceptance_rate": stats.acceptance_rate,
           "mean_accept_length": stats.mean_accept_length, "steps_by_depth": stats.steps_by_depth,
           "mean_depth": stats.proposed / stats.steps, "draft_s": draft_s, "verify_s": verify_s,
           "tpot_s": (draft_s + verify_s) / stats.committed}
    if isinstance(policy, AdaptiveDepth):  # what it learned: the fitted cost line, the acceptances
        run["policy_after"] = policy.describe() | {"acceptance": policy.acceptance()}
    return run


def run_context(target: TargetLM, head: MTPHead, prompt: torch.Tensor, preset: Preset, depths: tuple[int, ...],
                rounds: int, prefill: Prefill, on_run: Callable[[str], object] = lambda what: None,
                loop: str = "eager") -> dict:
    """``rounds`` rounds of: dense decoding, then every (arm, policy), each from ``prefill`` and
    lossless asserted. A round runs every method once, so a drift of the machine's speed touches all
    alike; each method's ``tpot_s`` is the median of its rounds (every round's beside it), its
    counts the first round's (the same in every round but for the adaptive policy, whose depths
    follow the measured times: its mean depth and AL of every round are kept too).
    ``on_run`` hears each run's name."""
    spec = preset.spec
    arms = sorted(spec.keysets, key=lambda c: c.window is not None)  # native first: the baseline
    dense_tpots: list[float] = []
    runs: dict = {ks.label: {name: [] for name in policies(depths, spec.depth)} for ks in arms}
    for r in range(rounds):
        steps: list[float] = []
        dense = loop_generators(loop)[0](target, prompt, spec.new_tokens, step_times=steps, prefill=prefill)
        dense_tpots.append(statistics.fmean(steps))  # seconds per token its decode passes made, as tpot_s
        on_run(f"round {r + 1}: dense")
        for ks in arms:
            for name, make in policies(depths, spec.depth).items():
                runs[ks.label][name].append(one_run(target, head, prompt, preset, ks, name, make(), dense, prefill,
                                                    loop))
                on_run(f"round {r + 1}: {ks.label} {name}")
    dense_tpot = statistics.median(dense_tpots)
    row = {"context": prompt.numel(), "loop": loop, "new_tokens": len(dense), "rounds": rounds,
           "dense": {"tpot_s": dense_tpot, "tpot_s_rounds": dense_tpots}, "arms": {}}
    for ks in arms:
        summary = {}
        for name, rs in runs[ks.label].items():
            tpot = statistics.median(r["tpot_s"] for r in rs)
            summary[name] = rs[0] | {"tpot_s": tpot, "tpot_s_rounds": [r["tpot_s"] for r in rs],
                                     "tpot_speedup_vs_dense": speedup(dense_tpot, tpot),
                                     "mean_depth_rounds": [r["mean_depth"] for r in rs],
                                     "mean_accept_length_rounds": [r["mean_accept_length"] for r in rs]}
        row["arms"][ks.label] = {"n_sink": ks.n_sink, "window": ks.window, "gate": ks.gate, "policies": summary,
                                 "fastest_policy": min(summary, key=lambda n: summary[n]["tpot_s"])}
    return row


def bench_depth(preset: Preset, dataset_dir: str | None, device: torch.device, seed: int, contexts: tuple[int, ...],
                depths: tuple[int, ...], rounds: int, cache_dir: Path, command: str, progress: bool = False, log=print,
                on_context: Callable[[dict], object] | None = None, loop: str = "eager") -> dict:
    """Load (or train) reproduce's models, then ``run_context`` for every context.

    ``on_context`` gets the metrics so far after each context, to write a partial file.

    Raises:
        ValueError: for a bad depth, number of rounds or loop, or a context the corpus cannot fill.
    """
    check_options(depths, preset.spec.depth, rounds, loop, device)
    t_start = time.perf_counter()
    setup = bench_setup(DEPTH_KIND, preset, dataset_dir, device, seed, contexts, cache_dir, command, progress, log)
    names = list(policies(depths, preset.spec.depth))
    result = {
        **setup.header,
        "depths": list(depths), "policies": names, "rounds": rounds, "loop": loop, "tpot": TPOT_NOTE,
        "lossless": "asserted: every (arm, policy)'s tokens equal dense greedy decoding's (torch.equal)",
        "rows": [], "complete": False,
    }
    per_round = 1 + len(preset.spec.keysets) * len(names)  # dense, then every (arm, policy)

    def rows(prompt, pre, tick):
        yield run_context(setup.target, setup.head, prompt, preset, depths, rounds, pre, tick, loop)

    return run_contexts("bench depth", setup, preset, device, contexts, rounds * per_round, rows, result, t_start,
                        progress, log, on_context)


def table(result: dict):
    """A rich table: one line per (context, arm, policy), native first, dense TPOT per context."""
    from rich.table import Table

    env = result["environment"]
    t = Table(title=f"wmtp bench depth ({env.get('device_name', env['device'])}, {result['decode_dtype']}, "
                    f"{result.get('loop', 'eager')} loop; "
                    "TPOT = decode seconds / tokens kept)")
    for col in ("context", "dense TPOT ms", "arm", "policy", "mean depth", "AL", "TPOT ms", "TPOT speedup vs dense"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        first = True
        for label, arm in r["arms"].items():
            for name, p in arm["policies"].items():
                mark = " *" if name == arm["fastest_policy"] else ""
                t.add_row(str(r["context"]) if first else "", f"{r['dense']['tpot_s'] * 1e3:.3f}" if first else "",
                          label, name + mark, f"{p['mean_depth']:.2f}", f"{p['mean_accept_length']:.2f}",
                          f"{p['tpot_s'] * 1e3:.3f}", f"{p['tpot_speedup_vs_dense']:+.1%}")
                first = False
    t.caption = "* the arm's lowest TPOT"
    return t


def add_arguments(p) -> None:
    """``wmtp bench depth``'s options (wmtp/cli.py builds the parser)."""
    add_model_arguments(p)
    add_keysets_argument(p)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 16384],
                   help="prompt lengths (default: 1024 16384)")
    p.add_argument("--depths", type=int, nargs="+", default=None,
                   help="fixed draft depths, each in [1, the preset's depth]; the two adaptive policies always run "
                        "(default: those of 1 3 7 up to the preset's depth, and the preset's depth: small 1 3 7, "
                        "tiny 1 3)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of every method, interleaved; TPOT is their median (default: 3)")
    p.add_argument("--loop", choices=LOOPS, default="eager",
                   help="eager: wmtp/decode.py's loops; graph: wmtp/static_decode.py's CUDA graphs, CUDA only "
                        "(default: eager)")
    p.add_argument("--out", type=Path, default=None,
                   help="write the JSON here and its plot beside it " + out_help("depth"))


def cli(args, prog: str, argv: list[str]) -> int:
    """Run ``wmtp bench depth``: check the options, write the JSON after every context, print a table."""
    device, preset, slug = model_options(args)
    k = preset.spec.depth
    depths = tuple(args.depths or sorted({d for d in (1, 3, 7) if d <= k} | {k}))  # small: 1 3 7; tiny: 1 3
    check_options(depths, k, args.rounds, args.loop, device)
    return bench_cli(args, prog, argv, "depth", slug, lambda command, log, on_context: bench_depth(
        preset, args.dataset_dir, device, args.seed, tuple(args.contexts), depths, args.rounds,
        args.cache_dir, command, progress=not args.no_progress, log=log, on_context=on_context, loop=args.loop), table,
        plot=True)
