"""Training and evaluation of the target LM and of the MTP head (target frozen).

The target is trained with next-token cross-entropy at ``TrainConfig.seq_len``. The MTP head is
then trained, the target frozen, on recursive draft steps ``k = 1 .. MTPConfig.train_depth``
(arXiv 2607.21535, Sec. 2; DeepSeek-V3 MTP): step ``k`` reads the step ``k-1`` hidden state
(the target's for ``k = 1``) at position ``t`` and the token ``t+k``, and predicts token ``t+k+1``.
Every step's stream is teacher-forced over the whole window, so its keys come from the same
step; at inference the keys of committed positions come from step 1 (wmtp/decode.py). Batches are
drawn with an explicit ``torch.Generator``. Checkpoints are written atomically and refuse to load
into a model of another configuration; ``weights_sha256`` digests the weights they hold.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .checks import check_int, check_tensors
from .config import TrainConfig
from .fileio import atomic_path
from .model import TargetLM
from .mtp import MTPHead


def random_windows(tokens: torch.Tensor, batch_size: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``(batch_size, length)`` windows of ``tokens`` at random offsets in ``[0, numel - length)``
    (0 for a text of exactly one window). The last offset, ``numel - length``, is never drawn: the
    committed reproductions trained on these draws (changing them needs a ``CHECKPOINT_VERSION`` bump)."""
    if tokens.numel() < length:
        raise ValueError(f"training text has {tokens.numel()} tokens; need at least {length}")
    starts = torch.randint(0, max(tokens.numel() - length, 1), (batch_size,), generator=generator,
                           device=generator.device)
    return torch.stack([tokens[s : s + length] for s in starts.tolist()])  # (B, length)


def _lr(step: int, cfg_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return cfg_lr * (step + 1) / warmup
    return cfg_lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn(), disable=not enabled)


def _optimise(params, loss_fn, steps: int, lr: float, cfg: TrainConfig, label: str, progress: bool) -> list[float]:
    params = list(params)
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    losses = []
    with _progress(progress) as bar:
        task = bar.add_task(label, total=steps, loss=float("nan"))
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = _lr(step, lr, cfg.warmup_steps, steps)
            loss = loss_fn()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            losses.append(loss.item())
            bar.update(task, advance=1, loss=losses[-1])
    return losses


def train_target(target: TargetLM, tokens: torch.Tensor, cfg: TrainConfig, generator: torch.Generator,
                 progress: bool = True) -> list[float]:
    """Next-token training of ``target`` on ``tokens`` (1-D); returns the loss of every step."""
    target.train()

    def loss_fn() -> torch.Tensor:
        x = random_windows(tokens, cfg.batch_size, cfg.seq_len + 1, generator).to(target.embed.device)
        logits, _ = target(x[:, :-1], impl="torch")
        return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())

    losses = _optimise(target.parameters(), loss_fn, cfg.target_steps, cfg.lr, cfg, "target LM", progress)
    target.eval()
    return losses


def head_step_logits(head: MTPHead, target: TargetLM, x: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """Teacher-forced recursive draft logits for windows ``x`` ``(B, L + depth + 1)``.

    Returns ``depth`` tensors ``(B, L, V)``: entry ``k-1`` at position ``t`` guesses ``x[:, t+k+1]``.
    """
    L = x.shape[1] - depth - 1
    with torch.no_grad():
        _, hidden = target(x[:, :L], impl="torch")  # (B, L, d), the target's hidden states
    out = []
    for k in range(1, depth + 1):
        logits, hidden = head(hidden, x[:, k : k + L], impl="torch")  # (B, L, V), (B, L, d)
        out.append(logits)
    return out


def train_head(head: MTPHead, target: TargetLM, tokens: torch.Tensor, cfg: TrainConfig,
               generator: torch.Generator, progress: bool = True) -> list[float]:
    """Train the MTP head with the target (and the shared embedding and LM head) frozen."""
    depth = head.config.train_depth
    target.requires_grad_(False)
    head.train()

    def loss_fn() -> torch.Tensor:
        x = random_windows(tokens, cfg.batch_size, cfg.seq_len + depth + 1, generator).to(head.proj.device)
        steps = head_step_logits(head, target, x, depth)
        L = cfg.seq_len
        return sum(F.cross_entropy(lg.flatten(0, 1), x[:, k + 1 : k + 1 + L].flatten())
                   for k, lg in enumerate(steps, start=1)) / depth

    try:
        return _optimise(head.parameters(), loss_fn, cfg.head_steps, cfg.head_lr, cfg, "MTP head", progress)
    finally:
        target.requires_grad_(True)
        head.eval()


@torch.no_grad()
def head_accuracy(head: MTPHead, target: TargetLM, tokens: torch.Tensor, depth: int, seq_len: int,
                  n_windows: int, generator: torch.Generator) -> list[float]:
    """Top-1 accuracy of the teacher-forced head at draft positions ``1 .. depth`` (``tokens`` on
    any device: the windows move to the head's)."""
    # (n_windows, seq_len + depth + 1): each window's seq_len positions and the depth + 1 tokens after them
    x = random_windows(tokens, n_windows, seq_len + depth + 1, generator).to(head.proj.device)
    steps = head_step_logits(head, target, x, depth)
    return [(lg.argmax(-1) == x[:, k + 1 : k + 1 + seq_len]).sum().item() / (n_windows * seq_len)  # no fp64 on MPS
            for k, lg in enumerate(steps, start=1)]


@torch.no_grad()
def perplexity(target: TargetLM, tokens: torch.Tensor, context: int, n_tokens: int | None = None) -> float:
    """Perplexity of the first ``n_tokens`` tokens read in consecutive windows of ``context`` tokens.

    Every context length scores the same text (``n_tokens``, default one window), so the numbers
    compare how well the model uses longer contexts, not how hard different passages are.

    Raises:
        ValueError: for ``tokens`` that are not a tensor, a ``context`` or ``n_tokens`` that is not an
            int >= 1, an ``n_tokens`` below ``context`` (no whole window), or too few tokens for the
            windows.
    """
    check_tensors(tokens=tokens)
    check_int("context", context, 1)  # 0 divided by zero; a negative one scored a slice and returned exp(-x)
    if n_tokens is not None:
        check_int("n_tokens", n_tokens, 1)
    n_tokens = n_tokens or context
    n_windows = n_tokens // context
    if n_windows < 1:
        raise ValueError(f"n_tokens={n_tokens} scores no whole window of context {context}")
    if tokens.numel() < n_windows * context + 1:
        raise ValueError(f"evaluation text has {tokens.numel()} tokens; need {n_windows * context + 1}")
    nll = 0.0
    for w in range(n_windows):
        x = tokens[w * context : (w + 1) * context + 1][None].to(target.embed.device)  # (1, context + 1)
        logits, _ = target(x[:, :-1], impl="torch")  # (1, context, V)
        nll += F.cross_entropy(logits[0].cpu().double(), x[0, 1:].cpu(), reduction="sum").item()  # fp64 on the CPU
    return math.exp(nll / (n_windows * context))


def save_checkpoint(path: str | Path, target: TargetLM, head: MTPHead, meta: dict) -> None:
    """Write both models and ``meta`` (configs, corpus) atomically: temp file, then rename."""
    blob = {"meta": meta, "target": target.state_dict(), "head": head.state_dict()}
    with atomic_path(path) as tmp:
        torch.save(blob, tmp)

def load_checkpoint(path: str | Path, target: TargetLM, head: MTPHead, meta: dict) -> None:
    """Load a checkpoint written for exactly ``meta``; raise ``ValueError`` naming what differs, or for a file
    whose weights are not ``target``'s and ``head``'s (names and shapes; checked before either loads)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"checkpoint path must be a str or a Path, got {type(path).__name__}")
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict (checkpoint_meta's), got {type(meta).__name__}")
    if Path(path).exists() and not Path(path).is_file() and not Path(path).is_dir():  # reading a FIFO would hang
        raise ValueError(f"checkpoint {path} is not a regular file (a device, FIFO or socket)")
    try:
        blob = torch.load(path, map_location=target.embed.device, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"no such checkpoint: {path}") from None
    except OSError as e:  # a folder, no permission
        raise ValueError(f"cannot read checkpoint {path}: {e.strerror or type(e).__name__}") from None
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"checkpoint {path} cannot be read: not a file torch.save wrote, or a damaged one "
                         f"({type(e).__name__})") from None
    saved = blob.get("meta") if isinstance(blob, dict) else None
    saved = saved if isinstance(saved, dict) else {}
    diff = sorted(k for k in set(meta) | set(saved) if saved.get(k) != meta.get(k))
    if diff:
        raise ValueError(f"checkpoint {path} was made for another config (differs in: {', '.join(diff)})")
    for name, model in (("target", target), ("head", head)):  # load_state_dict would raise after loading some
        weights, want = blob.get(name) if isinstance(blob, dict) else None, model.state_dict()
        if not isinstance(weights, dict) or weights.keys() != want.keys() or any(
                not isinstance(weights[k], torch.Tensor) or weights[k].shape != w.shape for k, w in want.items()):
            raise ValueError(f"checkpoint {path} holds no {name} weights of this {type(model).__name__}'s names and "
                             "shapes (another model config, or not a wmtp checkpoint)")
    target.load_state_dict(blob["target"])
    head.load_state_dict(blob["head"])


def weights_sha256(target: TargetLM, head: MTPHead) -> str:
    """sha256 of each state_dict entry (target's, head's; sorted): name, dtype, shape, CPU bytes; 16 hex chars."""
    h = hashlib.sha256()
    for prefix, model in (("target.", target), ("head.", head)):
        for name, w in sorted(model.state_dict().items()):
            h.update(f"{prefix}{name}\0{str(w.dtype).removeprefix('torch.')}\0{list(w.shape)}\0".encode())
            h.update(w.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


CHECKPOINT_VERSION = 1  # bump when the code changes what training makes of the same configs, corpus and seed


def checkpoint_meta(preset, corpus_name: str, corpus_fingerprint: str, seed: int) -> dict:
    """What a checkpoint must match to be reused: configs, corpus, seed and ``CHECKPOINT_VERSION``
    (JSON-comparable), so that a checkpoint of older training code is not reused silently."""
    return {"model": _jsonable(asdict(preset.model)), "mtp": asdict(preset.mtp), "train": asdict(preset.train),
            "corpus": corpus_name, "corpus_fingerprint": corpus_fingerprint, "seed": seed,
            "version": CHECKPOINT_VERSION}


def _jsonable(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
