"""``wmtp generate``: text from reproduce's models with the MTP head's accepted drafts marked
(wmtp/generate.py), once per draft key set, beside dense greedy decoding (arXiv 2607.21535,
Sec. 2: the key set changes which drafts the target accepts, never the text). Its options, their
checks before any work, and the printed text, table and JSON.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch

from .attention import IMPLS
from .config import KeySetConfig, parse_keyset
from .generate import DRAFT_STYLE, MAX_DEPTH, MAX_NEW_TOKENS, generate, loop_functions, styled_text, token_pieces

__all__ = ["add_arguments", "cli"]


def add_arguments(p) -> None:
    """``wmtp generate``'s options (wmtp/cli.py builds the parser)."""
    from .cli import seed_arg

    p.add_argument("prompt", nargs="?", default=None,
                   help="the prompt's text (default: the last --context tokens of the corpus); its last 64 "
                        "tokens are printed, dim, before the new text")
    p.add_argument("--context", type=int, default=None,
                   help="without a prompt: the corpus's last CONTEXT tokens (default: 256)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help=f"tokens to generate, at most {MAX_NEW_TOKENS}; an end-of-text token stops it (default: 64)")
    p.add_argument("--depth", type=int, default=None,
                   help=f"draft tokens per step, at most {MAX_DEPTH} (default: the preset's)")
    p.add_argument("--keyset", nargs="+", default=None, metavar="SINK:WINDOW[@GATE]|native",
                   help="the draft's key set, e.g. 8:64, or native; 8:64@4096 drafts natively up to a context of "
                        "4096 tokens and over 8+64 keys past it; several: one run each, the same text with other "
                        "drafts marked (default: the preset's last windowed one)")
    p.add_argument("--impl", default="auto", choices=IMPLS, help="attention implementation (default: auto)")
    p.add_argument("--loop", default="eager", choices=("eager", "graph"),
                   help="eager: wmtp/decode.py's loops; graph: wmtp/static_decode.py's in CUDA graphs, CUDA and "
                        "Triton only, timed on the device (default: eager)")
    p.add_argument("--no-check", action="store_true", help="skip the dense greedy run the output is compared with")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the prompt, the new tokens, their marks and the counters as JSON")
    p.add_argument("--preset", default="small", help="named preset (default: small, reproduce's models; tiny: "
                   "trained for seconds, its text means nothing, often blank)")
    p.add_argument("--dataset-dir", default=None, help="as reproduce's (default: none: the hub if online, else the "
                   "offline corpus python-stdlib)")
    p.add_argument("--seed", type=seed_arg, default=42, help="the models' seed, as reproduce's (default: 42)")
    p.add_argument("--device", default="auto", help="cpu, mps, cuda or auto (default: auto)")
    p.add_argument("--cache-dir", type=Path, default=Path(".wmtp-cache"),
                   help="tokenizer and checkpoint cache, shared with reproduce (default: .wmtp-cache; without "
                        "a checkpoint for this preset, corpus and seed the models are trained first)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _options(args):
    """The command line checked before any work: (preset, device, dtype, impl, key sets, depth)."""
    from .attention import resolve_impl
    from .config import get_preset
    from .device import resolve_device
    from .fileio import check_cache_dir, check_writable

    device, preset = resolve_device(args.device), get_preset(args.preset)
    if args.prompt is not None and args.context is not None:
        raise ValueError("give a prompt or --context, not both")
    if args.prompt == "":
        raise ValueError("the prompt is empty")
    try:
        (args.prompt or "").encode("utf-8")
    except UnicodeEncodeError:  # argv's bytes that are not UTF-8 arrive as lone surrogates: the tokenizer refuses them
        raise ValueError("the prompt is not UTF-8 text (give it from a UTF-8 terminal or file)") from None
    if args.context is not None and args.context < 1:
        raise ValueError(f"--context must be at least 1, got {args.context}")
    if not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"--max-new-tokens must be from 1 to {MAX_NEW_TOKENS}, got {args.max_new_tokens}")
    depth = preset.spec.depth if args.depth is None else args.depth
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"--depth must be from 1 to {MAX_DEPTH}, got {depth}")
    windowed = [k for k in preset.spec.keysets if k.window is not None]
    keysets = ([_keyset(k) for k in args.keyset] if args.keyset
               else [windowed[-1] if windowed else KeySetConfig(0, None)])
    twice = [k.label for i, k in enumerate(keysets) if k in keysets[:i]]
    if twice:  # as reproduce refuses it (SpecConfig): the same run twice
        raise ValueError(f"key set {twice[0]} is given twice")
    dtype = torch.float32 if device.type == "mps" else torch.float64  # decode.py NOTE [Exactness]; MPS: no float64
    m = preset.model
    impl = resolve_impl(args.impl, device, dtype, m.head_dim, m.n_heads // m.n_kv_heads)
    if args.loop == "graph" and (device.type != "cuda" or impl != "triton"):
        raise ValueError(f"--loop graph captures CUDA graphs of the Triton kernels; got device {device.type}, "
                         f"impl {impl}")
    if args.out is not None:
        check_writable(args.out, "--out")
    check_cache_dir(args.cache_dir, {"--out": args.out})
    return preset, device, dtype, impl, keysets, depth


def _keyset(text: str) -> KeySetConfig:
    """``--keyset``'s ``native`` or ``parse_keyset``'s forms (whose range errors name ``--keyset``)."""
    if text == "native":
        return KeySetConfig(0, None)
    if not re.fullmatch(r"-?[0-9]+:-?[0-9]+(@-?[0-9]+)?", text):
        raise ValueError(f"key set {text!r} is not native, SINK:WINDOW or SINK:WINDOW@GATE (integers, e.g. 8:64 "
                         "or 8:64@8192)")
    return parse_keyset(text, "--keyset")


def cli(args, prog: str, argv: list[str]) -> int:
    """Run ``wmtp generate``: load (or train) reproduce's models, generate, print the text with the
    accepted drafts highlighted and the run's counters; exit 1 if the output differs from dense."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from . import data, tokenizer
    from .bench_common import long_prompt, with_capacity
    from .cli import stdout_console
    from .metrics import SCHEMA_VERSION, command_line, environment, write_json
    from .reproduce import prepare_models

    preset, device, dtype, impl, keysets, depth = _options(args)
    err = Console(stderr=True)

    def log(line: str) -> None:
        err.print(line, markup=False, highlight=False, soft_wrap=True)

    corpus = data.load_corpus(args.dataset_dir, max_chars=preset.train.max_train_chars)
    log(corpus.message)
    tok = tokenizer.train_tokenizer(corpus, preset.model.vocab_size, args.cache_dir)
    tokens = tokenizer.corpus_token_splits(corpus, tok)
    prompt = (tokenizer.encode(tok, args.prompt) if args.prompt is not None
              else long_prompt(tokens, args.context or 256, "--context"))
    if not prompt.numel():
        raise ValueError("the prompt encodes to no tokens")
    target, head, _ = prepare_models(preset, corpus, tokens, args.seed, device, args.cache_dir, None,
                                     not args.no_progress, log)
    target, head = with_capacity(target.to(dtype), head.to(dtype), prompt.numel() + args.max_new_tokens + depth)
    prompt, eos = prompt.to(device), tokenizer.eos_id(tok)
    work = f"{prompt.numel()} prompt tokens (each run's prefill reads them all), {args.max_new_tokens} new tokens"
    dense_steps, dense, runs = _Steps(), None, []  # the dense run's one-token steps, seconds
    with _progress(not args.no_progress) as bar:
        def tokens_bar(what: str) -> Callable[[int], None]:  # a run's bar; the prefill's token counts at once
            task = bar.add_task(what, total=args.max_new_tokens, completed=1)
            return lambda n: bar.update(task, completed=min(args.max_new_tokens, bar.tasks[task].completed + n))

        if not args.no_check:
            log(f"dense greedy decoding: {work}")
            dense_steps.on_step = tokens_bar("dense greedy")
            dense = loop_functions(args.loop)[0](target, prompt, args.max_new_tokens, impl=impl, eos_id=eos,
                                                 step_times=dense_steps)
        for ks in keysets:
            log(f"speculative decoding, {ks.label}, depth {depth}: {work}")
            runs.append(generate(target, head, prompt, args.max_new_tokens, depth, ks.n_sink, ks.window, impl,
                                 check=not args.no_check, eos_id=eos, reference=dense, loop=args.loop, gate=ks.gate,
                                 on_step=tokens_bar(ks.label)))
    out, dec = stdout_console(), (lambda x: tokenizer.decode(tok, x))
    shown = dec(prompt[-64:]).lstrip("\ufffd").lstrip("\n")  # from a whole character, no blank lines first
    out.print(Text(shown, style="dim"), soft_wrap=True)
    for ks, g in zip(keysets, runs):
        out.rule(ks.label, style="dim")
        out.print(styled_text(token_pieces(dec, g.ids.tolist()), g.drafted), soft_wrap=True)
    out.print(Text.assemble(("accepted draft", DRAFT_STYLE), " / the target's token / ", ("prompt", "dim")))
    table = Table(title=f"wmtp generate: {prompt.numel()} prompt tokens, depth {depth}, {device.type}, "
                        f"{str(dtype)[6:]}, {impl}")
    for col in ("key set", "new tokens", "steps", "AL", "acceptance", "draft keys / query", "ms / token",
                "identical to dense greedy"):
        table.add_column(col, justify="right")
    if dense is not None:
        table.add_row("dense", str(dense.numel()), str(len(dense_steps)), "1.00", "", "",
                      _ms(sum(dense_steps), len(dense_steps)), "")
    for ks, g in zip(keysets, runs):
        s = g.stats
        table.add_row(ks.label, str(g.ids.numel()), str(s.steps), f"{s.mean_accept_length:.2f}",
                      f"{s.acceptance_rate:.2f}", f"{s.draft_keys_read / max(s.draft_queries, 1):.0f}",
                      _ms(sum(s.draft_times_s) + sum(s.verify_times_s), s.committed),
                      {None: "not checked", True: "yes", False: "NO"}[g.dense_equal])
    table.caption = ("ms / token: the decode steps' seconds over the tokens they added (prefill aside; "
                     f"{'device' if args.loop == 'graph' else 'wall-clock'} times)")
    out.print(table)
    if args.out is not None:
        write_json(args.out, {
            "schema_version": SCHEMA_VERSION, "kind": "generate", "command": command_line(prog, argv),
            "environment": environment(device), "preset": preset.name, "seed": args.seed, "corpus": corpus.name,
            "depth": depth, "decode_dtype": str(dtype)[6:], "impl": impl, "loop": args.loop,
            "prompt_ids": prompt.tolist(), "dense_ids": None if dense is None else dense.tolist(),
            "dense_step_s": dense_steps,
            "runs": [{"n_sink": ks.n_sink, "window": ks.window, "gate": ks.gate, "ids": g.ids.tolist(),
                      "drafted": g.drafted, "text": dec(g.ids), "steps": g.stats.steps, "proposed": g.stats.proposed,
                      "accepted": g.stats.accepted, "draft_queries": g.stats.draft_queries,
                      "draft_keys_read": g.stats.draft_keys_read, "mean_accept_length": g.stats.mean_accept_length,
                      "acceptance_rate": g.stats.acceptance_rate, "seconds": g.seconds,
                      "draft_s": sum(g.stats.draft_times_s), "verify_s": sum(g.stats.verify_times_s),
                      "committed": g.stats.committed,
                      "identical_to_dense_greedy": g.dense_equal} for ks, g in zip(keysets, runs)]})
    if any(g.dense_equal is False for g in runs):
        why = ("a bug, please report it" if dtype == torch.float64 else
               "in float32 a near-tie can flip an argmax (decode.py NOTE [Exactness])")
        log(f"the output differs from dense greedy decoding: {why}")  # one line, however long
        return 1
    return 0


class _Steps(list):
    """The dense run's step seconds (``step_times``: anything with ``append``); each one-token step
    also goes to ``on_step``, the run's progress bar: the eager loop appends a step's seconds as it
    ends, the graph loop (wmtp/static_decode.py's ``greedy_steps``) extends by all of them at the end."""

    on_step: Callable[[int], object] = staticmethod(lambda n: None)

    def append(self, seconds: float) -> None:
        super().append(seconds)
        self.on_step(1)

    def extend(self, seconds) -> None:
        seconds = list(seconds)
        super().extend(seconds)
        self.on_step(len(seconds))


def _progress(enabled: bool):
    """The runs' progress bars, new tokens of ``--max-new-tokens``, on stderr (stdout holds the
    text); cleared when the runs end."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True, disable=not enabled)


def _ms(seconds: float, tokens: int) -> str:
    return f"{seconds / tokens * 1e3:.3f}" if tokens else ""
