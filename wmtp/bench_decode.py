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
``depth + 1`` rows (one at the first step; NOTE [Static extend]), the eager loop's only the
``a + 1`` committed positions, so the two loops' counts differ.

The models are reproduce's (the same checkpoint: wmtp/reproduce.py ``prepare_models``), with the
KV-cache capacity raised to the longest context (their weights do not depend on it). The prompt is
the last ``context`` tokens of the corpus's train, valid and test splits end to end, so decoding
continues the test split while the far context is text the models trained on: acceptance at these
lengths is this small model's, on this text, and says nothing general.
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
    with_capacity,  # noqa: F401  (experiments 17 and 18 import it from here)
)
from .checks import check_int
from .config import Preset
from .metrics import reduction, speedup, tpot
from .model import TargetLM
from .mtp import MTPHead
from .plots import DECODE_KIND
from .prefill import Prefill
from .request import DRAFT_CACHES


def run_context(target: TargetLM, head: MTPHead, prompt: torch.Tensor, preset: Preset, loop: str,
                prefill: Prefill, draft_caches: tuple[str, ...] = ("full",)) -> dict:
    """Dense decoding and every draft arm at one context with one loop, each from ``prefill``;
    lossless asserted first. An ungated windowed key set runs once per draft cache of ``draft_caches``
    (the ring's arm is labelled ``"<key set> ring"``); the native and gated drafts, which a ring cannot
    hold, run once with the full draft KV whatever ``draft_caches`` says (the native arm is the
    reference of ``draft_time_reduction_vs_native``)."""
    spec = preset.spec
    greedy, speculative = loop_generators(loop)
    dense_steps: list[float] = []
    dense = greedy(target, prompt, spec.new_tokens, step_times=dense_steps, prefill=prefill)
    dense_step = statistics.median(dense_steps)
    row = {"context": prompt.numel(), "loop": loop, "new_tokens": len(dense),
           "dense": {"step_median_s": dense_step, "tpot_s": dense_step}, "arms": {}}
    native_draft = None
    arms = [(ks, cache) for ks in sorted(spec.keysets, key=lambda c: c.window is not None)  # native first
            for cache in (draft_caches if ks.window is not None and ks.gate is None else ("full",))]
    for ks, cache in arms:
        label = ks.label if cache == "full" else f"{ks.label} {cache}"
        out, stats = speculative(target, head, prompt, spec.new_tokens, spec.depth, ks.n_sink, ks.window,
                                 prefill=prefill, draft_cache=cache, gate=ks.gate)
        if not torch.equal(out, dense):
            raise AssertionError(f"arm {label} ({loop} loop) at context {prompt.numel()} is not lossless")
        draft_step, verify_step = statistics.median(stats.draft_times_s), statistics.median(stats.verify_times_s)
        native_draft = draft_step if ks.window is None else native_draft
        t = tpot(verify_step, draft_step, stats.mean_accept_length)
        row["arms"][label] = {
            "lossless": True, "n_sink": ks.n_sink, "window": ks.window, "gate": ks.gate, "draft_cache": cache,
            "draft_kv_bytes": stats.draft_kv_bytes, "steps": stats.steps,
            "acceptance_rate": stats.acceptance_rate, "mean_accept_length": stats.mean_accept_length,
            "draft_keys_read_per_step": stats.draft_keys_read / stats.steps,
            "draft_time_per_step_s": draft_step, "verify_time_per_step_s": verify_step,
            "draft_share_of_step": draft_step / (draft_step + verify_step),
            "tpot_s": t, "tpot_speedup_vs_dense": speedup(dense_step, t),
            "draft_time_reduction_vs_native": None if native_draft is None else reduction(native_draft, draft_step),
        }
    return row


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
    if not loops or any(lp not in LOOPS for lp in loops) or len(set(loops)) < len(loops):
        raise ValueError(f"loops must be distinct ones of {', '.join(LOOPS)}, got {list(loops)}")
    if not draft_caches or not set(draft_caches) <= set(DRAFT_CACHES) or len(set(draft_caches)) < len(draft_caches):
        raise ValueError(f"draft caches must be distinct ones of {', '.join(DRAFT_CACHES)}, got {list(draft_caches)}")
    if page_size is not None:
        check_int("--page-size", page_size, 1)
        if contexts and page_size > min(contexts):  # a prefill's caches hold a context and a few more positions
            raise ValueError(f"--page-size must be at most the smallest context {min(contexts)}, got {page_size}")
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


def add_arguments(p) -> None:
    """``wmtp bench decode``'s options (wmtp/cli.py builds the parser)."""
    add_model_arguments(p)
    add_keysets_argument(p)
    p.add_argument("--contexts", type=int, nargs="+", default=[16384, 131072],
                   help="prompt lengths (default: 16384 131072)")
    p.add_argument("--loops", nargs="+", choices=LOOPS, default=None,
                   help="decode loops to time (default: eager and graph on CUDA, eager elsewhere)")
    p.add_argument("--draft-caches", nargs="+", choices=DRAFT_CACHES, default=["full"],
                   help="the windowed arms' draft KV: full, ring, or both; the native and gated arms read every "
                        "key, so they run once with the full draft KV whatever this says (default: full)")
    p.add_argument("--page-size", type=int, default=None,
                   help="keep the KV caches paged, in pages of this many positions (default: contiguous)")
    p.add_argument("--out", type=Path, default=None,
                   help="write the JSON here, its plot beside it as .png " + out_help("decode"))


def cli(args, prog: str, argv: list[str]) -> int:
    """Run ``wmtp bench decode``: check the options, write the JSON after every context, print a table."""
    device, preset, slug = model_options(args)
    loops = tuple(args.loops or (LOOPS if device.type == "cuda" else ("eager",)))
    return bench_cli(args, prog, argv, "decode", slug, lambda command, log, on_context: bench_decode(
        preset, args.dataset_dir, device, args.seed, tuple(args.contexts), loops, args.cache_dir, command,
        progress=not args.no_progress, log=log, on_context=on_context, draft_caches=tuple(args.draft_caches),
        page_size=args.page_size), table, plot=True)
