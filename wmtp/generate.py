"""Text from reproduce's models, each token marked by who wrote it: an accepted draft of the MTP
head, or the target itself (arXiv 2607.21535, Sec. 2: a step commits the drafts the target agrees
with, then one token of the target's own). ``wmtp generate`` prints it, and checks it against dense
greedy decoding: the marks change with the key set, the text never does.

``generate`` runs ``speculative_generate`` with a fixed-depth policy that hears every step's
accepted count (the loop's ``policy.update``), so the marks come from the run itself: the first
token is the prefill's (the target's), then each step's ``a`` accepted drafts and the target's
token, the whole cut where the output is (``drafted_marks``). ``token_pieces`` cuts the decoded
text at token boundaries, so a byte-level token that ends inside a character adds nothing and the
token that completes it carries the character.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .attention import IMPLS
from .decode import greedy_generate, speculative_generate
from .model import TargetLM
from .mtp import MTPHead
from .stats import SpecStats

__all__ = ["Generation", "drafted_marks", "generate", "styled_text", "token_pieces"]

MAX_NEW_TOKENS, MAX_DEPTH = 4096, 64  # the command line's bounds (token_pieces decodes every prefix)
DRAFT_STYLE = "bold green"  # an accepted draft, in the printed text


class _Recorder:
    """A fixed-depth policy (wmtp/policy.py's protocol) that keeps each step's accepted count."""

    def __init__(self, depth: int) -> None:
        self.max_depth, self.accepts = depth, []

    def depth(self, position: int) -> int:
        return self.max_depth

    def update(self, depth: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.accepts.append(accepted)

    def describe(self) -> dict:
        return {"policy": "fixed", "max_depth": self.max_depth}


def drafted_marks(accepts: list[int], n_tokens: int) -> list[bool]:
    """Which tokens of an output were accepted drafts.

    Args:
        accepts: each step's accepted drafts, in order.
        n_tokens: the output's length (the steps' tokens cut at ``max_new_tokens`` or an eos).

    Returns:
        ``n_tokens`` marks: ``True`` where a token is an accepted draft, ``False`` where the
        target wrote it (the first token, from the prefill, and each step's last).

    Raises:
        ValueError: for a negative count, or steps that commit fewer tokens than ``n_tokens``.
    """
    if any(a < 0 for a in accepts):
        raise ValueError(f"accepted counts must be >= 0, got {accepts}")
    marks = [False]  # the prefill's token
    for a in accepts:
        marks += [True] * a + [False]
    if len(marks) < n_tokens:
        raise ValueError(f"{len(accepts)} steps commit {len(marks)} tokens, fewer than the output's {n_tokens}")
    return marks[:n_tokens]


def token_pieces(decode, ids: list[int]) -> list[str]:
    """The text of ``ids`` (``decode(ids) -> str``) cut at token boundaries: piece ``i`` is the
    whole characters token ``i`` completes (a byte-level token may end inside a character, whose
    bytes decode to U+FFFD until the token that completes it); the pieces join to ``decode(ids)``.
    It decodes every prefix: meant for the few thousand tokens a terminal shows."""
    full, pieces, end = decode(ids), [], 0
    for i in range(len(ids)):
        prefix = decode(ids[: i + 1]).rstrip("\ufffd")  # a character cut at the end is not text yet
        new_end = max(end, len(prefix)) if full.startswith(prefix) else end
        pieces.append(full[end:new_end])
        end = new_end
    pieces[-1:] = [pieces[-1] + full[end:]] if pieces else []  # ids that end inside a character
    return pieces


@dataclass(frozen=True)
class Generation:
    """One generation: the new tokens, which were accepted drafts, the run's counters, and whether
    the tokens equal dense greedy decoding's (``None``: not checked)."""

    ids: torch.Tensor  # (N,) the new tokens
    drafted: list[bool]  # (N,) True: an accepted draft of the head
    stats: SpecStats
    seconds: float  # the speculative run's wall clock, prefill included
    dense_equal: bool | None


@torch.no_grad()
def generate(target: TargetLM, head: MTPHead, prompt_ids: torch.Tensor, max_new_tokens: int, depth: int,
             n_sink: int | None = None, window: int | None = None, impl: str = "auto", check: bool = True,
             eos_id: int | None = None, reference: torch.Tensor | None = None) -> Generation:
    """Greedy speculative decoding with each new token marked as an accepted draft or the target's.

    Args:
        target, head, prompt_ids, max_new_tokens, depth, n_sink, window, impl, eos_id: as
            ``speculative_generate``'s (``window=None``: the native draft, the whole context).
        check: compare the tokens with dense greedy decoding's: ``reference`` if given (the tokens of
            ``greedy_generate`` for the same arguments, run once for many key sets), else a run of it.

    Returns:
        A ``Generation``: the new tokens, their marks (``drafted_marks``), the run's counters, its
        seconds and, with ``check``, whether the tokens equal dense greedy decoding's.

    Raises:
        ValueError: as ``speculative_generate`` (a bad depth, key set or prompt).
    """
    recorder = _Recorder(depth)
    t0 = time.perf_counter()
    ids, stats = speculative_generate(target, head, prompt_ids, max_new_tokens, recorder, n_sink, window, impl=impl,
                                      eos_id=eos_id)
    seconds = time.perf_counter() - t0
    if check and reference is None:
        reference = greedy_generate(target, prompt_ids, max_new_tokens, impl=impl, eos_id=eos_id)
    dense_equal = torch.equal(ids, reference) if check else None
    return Generation(ids, drafted_marks(recorder.accepts, ids.numel()), stats, seconds, dense_equal)


def add_arguments(p) -> None:
    """``wmtp generate``'s options (wmtp/cli.py builds the parser)."""
    p.add_argument("prompt", nargs="?", default=None,
                   help="the prompt's text (default: the last --context tokens of the corpus); its last 64 "
                        "tokens are printed, dim, before the new text")
    p.add_argument("--context", type=int, default=None,
                   help="without a prompt: the corpus's last CONTEXT tokens (default: 256)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help=f"tokens to generate, at most {MAX_NEW_TOKENS}; an end-of-text token stops it (default: 64)")
    p.add_argument("--depth", type=int, default=None,
                   help=f"draft tokens per step, at most {MAX_DEPTH} (default: the preset's)")
    p.add_argument("--keyset", nargs="+", default=None, metavar="SINK:WINDOW|native",
                   help="the draft's key set, e.g. 8:64, or native; several: one run each, the same text with "
                        "other drafts marked (default: the preset's last windowed one)")
    p.add_argument("--impl", default="auto", choices=IMPLS, help="attention implementation (default: auto)")
    p.add_argument("--no-check", action="store_true", help="skip the dense greedy run the output is compared with")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the prompt, the new tokens, their marks and the counters as JSON")
    p.add_argument("--preset", default="small", help="named preset (default: small, reproduce's models)")
    p.add_argument("--dataset-dir", default=None, help="as reproduce's (default: the offline corpus fallback)")
    p.add_argument("--seed", type=int, default=42, help="the models' seed, as reproduce's (default: 42)")
    p.add_argument("--device", default="auto", help="cpu, mps, cuda or auto (default: auto)")
    p.add_argument("--cache-dir", type=Path, default=Path(".wmtp-cache"),
                   help="tokenizer and checkpoint cache, shared with reproduce (default: .wmtp-cache; without "
                        "a checkpoint for this preset, corpus and seed the models are trained first)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def styled_text(pieces: list[str], drafted: list[bool], prompt_text: str = ""):
    """A rich ``Text``: ``prompt_text`` dim, then each piece, bold green where it is an accepted draft."""
    from rich.text import Text

    text = Text(prompt_text, style="dim")
    for piece, mark in zip(pieces, drafted, strict=True):
        text.append(piece, style=DRAFT_STYLE if mark else None)
    return text


def _options(args):
    """The command line checked before any work: (preset, device, dtype, impl, key sets, depth)."""
    from .attention import resolve_impl
    from .config import KeySetConfig, get_preset, parse_keyset
    from .device import resolve_device
    from .fileio import check_writable

    device, preset = resolve_device(args.device), get_preset(args.preset)
    if args.prompt is not None and args.context is not None:
        raise ValueError("give a prompt or --context, not both")
    if args.prompt == "":
        raise ValueError("the prompt is empty")
    if args.context is not None and args.context < 1 or not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"--context must be at least 1 and --max-new-tokens from 1 to {MAX_NEW_TOKENS}")
    depth = preset.spec.depth if args.depth is None else args.depth
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"--depth must be from 1 to {MAX_DEPTH}, got {depth}")
    windowed = [k for k in preset.spec.keysets if k.window is not None]
    keysets = ([KeySetConfig(0, None) if k == "native" else parse_keyset(k) for k in args.keyset] if args.keyset
               else [windowed[-1] if windowed else KeySetConfig(0, None)])
    dtype = torch.float32 if device.type == "mps" else torch.float64  # decode.py NOTE [Exactness]; MPS: no float64
    m = preset.model
    impl = resolve_impl(args.impl, device, dtype, m.head_dim, m.n_heads // m.n_kv_heads)
    if not args.cache_dir.is_dir():
        check_writable(args.cache_dir / "x", "--cache-dir")
    if args.out is not None:
        check_writable(args.out, "--out")
        if args.out.resolve().is_relative_to(args.cache_dir.resolve()):
            raise ValueError(f"--out {args.out} is inside --cache-dir {args.cache_dir}: write it elsewhere")
    return preset, device, dtype, impl, keysets, depth


def cli(args, prog: str, argv: list[str]) -> int:
    """Run ``wmtp generate``: load (or train) reproduce's models, generate, print the text with the
    accepted drafts highlighted and the run's counters; exit 1 if the output differs from dense."""
    import shlex

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from . import data, tokenizer
    from .bench_common import long_prompt, with_capacity
    from .cli import stdout_console
    from .metrics import SCHEMA_VERSION, environment, write_json
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
              else long_prompt(tokens, args.context or 256))
    if not prompt.numel():
        raise ValueError("the prompt encodes to no tokens")
    target, head, _ = prepare_models(preset, corpus, tokens, args.seed, device, args.cache_dir, None,
                                     not args.no_progress, log)
    target, head = with_capacity(target.to(dtype), head.to(dtype), prompt.numel() + args.max_new_tokens + depth)
    prompt, eos = prompt.to(device), tokenizer.eos_id(tok)
    dense = None if args.no_check else greedy_generate(target, prompt, args.max_new_tokens, impl=impl, eos_id=eos)
    runs = [generate(target, head, prompt, args.max_new_tokens, depth, ks.n_sink, ks.window, impl,
                     check=dense is not None, eos_id=eos, reference=dense) for ks in keysets]
    out, dec = stdout_console(), (lambda x: tokenizer.decode(tok, x))
    out.print(Text(dec(prompt[-64:]).lstrip("\ufffd"), style="dim"), soft_wrap=True)  # from a whole character
    for ks, g in zip(keysets, runs):
        out.rule(ks.label, style="dim")
        out.print(styled_text(token_pieces(dec, g.ids.tolist()), g.drafted), soft_wrap=True)
    out.print(Text.assemble(("accepted draft", DRAFT_STYLE), " / the target's token / ", ("prompt", "dim")))
    table = Table(title=f"wmtp generate: {prompt.numel()} prompt tokens, depth {depth}, {device.type}, "
                        f"{str(dtype)[6:]}, {impl}")
    for col in ("key set", "new tokens", "steps", "AL", "acceptance", "draft keys / query", "seconds",
                "identical to dense greedy"):
        table.add_column(col, justify="right")
    for ks, g in zip(keysets, runs):
        s = g.stats
        table.add_row(ks.label, str(g.ids.numel()), str(s.steps), f"{s.mean_accept_length:.2f}",
                      f"{s.acceptance_rate:.2f}", f"{s.draft_keys_read / max(s.draft_queries, 1):.0f}",
                      f"{g.seconds:.2f}", {None: "not checked", True: "yes", False: "NO"}[g.dense_equal])
    out.print(table)
    if args.out is not None:
        write_json(args.out, {
            "schema_version": SCHEMA_VERSION, "kind": "generate", "command": shlex.join([prog, *argv]),
            "environment": environment(device), "preset": preset.name, "seed": args.seed, "corpus": corpus.name,
            "depth": depth, "decode_dtype": str(dtype)[6:], "impl": impl, "prompt_ids": prompt.tolist(),
            "dense_ids": None if dense is None else dense.tolist(),
            "runs": [{"n_sink": ks.n_sink, "window": ks.window, "ids": g.ids.tolist(), "drafted": g.drafted,
                      "text": dec(g.ids), "steps": g.stats.steps, "proposed": g.stats.proposed,
                      "accepted": g.stats.accepted, "draft_queries": g.stats.draft_queries,
                      "draft_keys_read": g.stats.draft_keys_read, "mean_accept_length": g.stats.mean_accept_length,
                      "acceptance_rate": g.stats.acceptance_rate, "seconds": g.seconds,
                      "identical_to_dense_greedy": g.dense_equal} for ks, g in zip(keysets, runs)]})
    if any(g.dense_equal is False for g in runs):
        why = ("a bug, please report it" if dtype == torch.float64 else
               "in float32 a near-tie can flip an argmax (decode.py NOTE [Exactness])")
        err.print(f"the output differs from dense greedy decoding: {why}", markup=False)
        return 1
    return 0
