"""``wmtp reproduce --paper windowed-mtp``: the CPU reproduction of Windowed-MTP, end to end.

Steps (arXiv 2607.21535, Sec. 4 in miniature): load the corpus; train (or load) the tokenizer,
the target LM and the MTP head; measure target perplexity at long contexts and the head's
per-position accuracy; then, at each context, decode with the dense target and with every draft
arm (native full-context MTP and the windowed key sets), *assert* that every arm's output equals
the dense output, and only then record acceptance, accept lengths, draft keys read, draft and
verify time, step time and TPOT side by side; finally time the draft attention alone per key set.
Everything lands in one metrics JSON with the configs, corpus, versions and command.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch

from . import data, tokenizer
from .bench import bench_draft_attention
from .config import Preset
from .decode import greedy_generate, speculative_generate
from .fileio import check_writable
from .metrics import SCHEMA_VERSION, environment, reduction, speedup, tpot, write_json
from .model import TargetLM
from .mtp import MTPHead
from .train import (
    checkpoint_meta,
    head_accuracy,
    load_checkpoint,
    perplexity,
    save_checkpoint,
    train_head,
    train_target,
    weights_sha256,
)

DRAFT_ATTENTION_BAR = {"context": 16384, "n_sink": 8, "window": 64, "min_ratio": 15.0, "judged_on": "cpu"}
# On a GPU one eager call of these small shapes costs the launcher, not the reads (medians of 75-135 us
# at every key count on an H200: metrics/python-stdlib-seed42-cuda-h200.json), so the ratio says nothing
# there: the bar is judged on CPU only; `wmtp bench attention --device cuda` times GPU kernels.


def draft_attention_bar(attn: list[dict], device: torch.device) -> dict | None:
    """``DRAFT_ATTENTION_BAR`` read from ``bench_draft_attention``'s rows: ``None`` without its row
    (another context list); ``met`` is ``None`` off the bar's device, where it is not judged."""
    b = DRAFT_ATTENTION_BAR
    key = (b["context"], b["n_sink"], b["window"], None)  # an ungated row: a gated one may read every key
    row = next((r for r in attn if (r["context"], r["n_sink"], r["window"], r.get("gate")) == key), None)
    if row is None:
        return None
    ratio = row["time_ratio_vs_native"]
    return {**b, "keys_read": row["keys_read"], "ratio": ratio,
            "met": ratio >= b["min_ratio"] if torch.device(device).type == b["judged_on"] else None}


def perplexity_tokens(n_valid: int, contexts: tuple[int, ...]) -> int:
    """Validation tokens that every context scores, the same text for all: up to four of the longest
    context, a multiple of every context (their least common multiple), and below ``n_valid``."""
    step = math.lcm(*contexts)
    n = min(max(4 * max(contexts), step), n_valid - 1) // step * step
    if n == 0:
        raise ValueError(f"the validation text has {n_valid} tokens; perplexity at contexts {list(contexts)} "
                         f"needs more than {step}")
    return n


def prepare_models(preset: Preset, corpus: data.Corpus, tokens: dict, seed: int, device: torch.device,
                   cache_dir: Path, checkpoint: Path | None, progress: bool, log) -> tuple[TargetLM, MTPHead, dict]:
    """Load the checkpoint made for exactly this config, corpus and seed, or train and save one.

    Training runs on the CPU whatever ``device`` is, so one config, corpus and seed give the same
    weights, and one checkpoint, on every device; the models move to ``device`` afterwards.

    The default checkpoint name carries a hash of all that, so a changed config trains anew; an
    explicit ``checkpoint`` made for anything else is refused with ``ValueError``. ``info`` holds the
    checkpoint's path, ``loaded``, the training's losses and times, and ``weights_sha256`` (the CPU
    weights', loaded or trained: ``train.weights_sha256``).
    """
    g = torch.Generator().manual_seed(seed)
    target = TargetLM(preset.model, generator=g)
    head = MTPHead(preset.mtp, target, generator=g)
    meta = checkpoint_meta(preset, corpus.name, corpus.fingerprint, seed)
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:12]
    checkpoint = checkpoint or cache_dir / f"ckpt-{preset.name}-{corpus.name}-seed{seed}-{digest}.pt"
    info: dict = {"checkpoint": str(checkpoint)}
    if checkpoint.exists():
        load_checkpoint(checkpoint, target, head, meta)
        log(f"loaded checkpoint {checkpoint}")
        info["loaded"] = True
    else:
        check_writable(checkpoint, "checkpoint")  # a read-only cache fails now, not after the training
        t0 = time.perf_counter()
        log(f"training the target ({preset.train.target_steps} steps), then the head ({preset.train.head_steps}); "
            f"saving them to {checkpoint}")
        info["target_losses"] = train_target(target, tokens["train"], preset.train, g, progress)
        info["target_train_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        info["head_losses"] = train_head(head, target, tokens["train"], preset.train, g, progress)
        info["head_train_s"] = time.perf_counter() - t0
        save_checkpoint(checkpoint, target, head, meta)
        info["loaded"] = False
    info["weights_sha256"] = weights_sha256(target, head)  # which weights, where checkpoint names collide
    return target.to(device).eval(), head.to(device).eval(), info


def run_arms(target: TargetLM, head: MTPHead, prompt: torch.Tensor, preset: Preset) -> dict:
    """Dense decode and every draft arm at one context; losslessness asserted before anything is kept.

    Every run generates exactly ``new_tokens`` (no end-of-text stop), so arms time the same work.
    Off the CPU, every run is made once untimed first, so no first-call kernel compile is timed.
    Times are medians over decode steps (prefill excluded): per-step draft and verify time, and
    TPOT from the step-cost model, ``(t_verify + t_draft) / AL``; dense TPOT is its median step.
    """
    spec = preset.spec
    if prompt.device.type != "cpu":  # untimed first runs: Triton compiles (or loads) its kernels on first calls
        greedy_generate(target, prompt, spec.new_tokens)
        for ks in spec.keysets:
            speculative_generate(target, head, prompt, spec.new_tokens, spec.depth, ks.n_sink, ks.window,
                                 gate=ks.gate)
    dense_steps: list[float] = []
    dense = greedy_generate(target, prompt, spec.new_tokens, step_times=dense_steps)
    dense_step = statistics.median(dense_steps)
    row = {"context": prompt.numel(), "new_tokens": len(dense),
           "dense": {"step_median_s": dense_step, "tpot_s": dense_step}, "arms": {}}
    native_draft = None
    for ks in sorted(spec.keysets, key=lambda c: c.window is not None):  # native first: the baseline
        out, stats = speculative_generate(target, head, prompt, spec.new_tokens, spec.depth, ks.n_sink, ks.window,
                                          gate=ks.gate)
        if not torch.equal(out, dense):
            raise AssertionError(f"arm {ks.label} at context {prompt.numel()} is not lossless: "
                                 f"speculative output differs from dense greedy output")
        s = stats.to_dict()
        draft_times, verify_times = s.pop("draft_times_s"), s.pop("verify_times_s")
        draft_step, verify_step = statistics.median(draft_times), statistics.median(verify_times)
        step = statistics.median(d + v for d, v in zip(draft_times, verify_times))
        tpot_s = tpot(verify_step, draft_step, stats.mean_accept_length)  # TPOT = step / AL, from medians
        native_draft = draft_step if ks.window is None else native_draft
        row["arms"][ks.label] = s | {
            "lossless": True, "n_sink": ks.n_sink, "window": ks.window, "gate": ks.gate,
            "draft_keys_read_per_step": stats.draft_keys_read / stats.steps,
            "draft_time_per_step_s": draft_step, "verify_time_per_step_s": verify_step, "step_median_s": step,
            "tpot_s": tpot_s, "tpot_speedup_vs_dense": speedup(dense_step, tpot_s),
            "draft_time_reduction_vs_native": reduction(native_draft, draft_step),
        }
    return row


def reproduce(preset: Preset, dataset_dir: str | None, device: torch.device, seed: int, out: Path | None,
              cache_dir: Path, checkpoint: Path | None, command: str, progress: bool = True, log=print) -> dict:
    """Run the whole reproduction; write and return the metrics dict."""
    t_start = time.perf_counter()
    corpus = data.load_corpus(dataset_dir, max_chars=preset.train.max_train_chars)
    log(corpus.message)
    tok = tokenizer.train_tokenizer(corpus, preset.model.vocab_size, cache_dir)
    tokens = tokenizer.corpus_token_splits(corpus, tok)
    ppl_tokens = perplexity_tokens(tokens["valid"].numel(), preset.spec.ppl_contexts)  # before the training
    if tokens["test"].numel() < max(preset.spec.contexts):  # the prompts: the test split's first tokens
        raise ValueError(f"the test split has {tokens['test'].numel()} tokens; context {max(preset.spec.contexts)} "
                         "needs more")
    target, head, train_info = prepare_models(preset, corpus, tokens, seed, device, cache_dir, checkpoint, progress,
                                              log)

    spec = preset.spec
    log("evaluating perplexity and head accuracy")
    ppl = {str(c): perplexity(target, tokens["valid"], c, ppl_tokens) for c in spec.ppl_contexts}
    acc = head_accuracy(head, target, tokens["valid"], spec.depth, preset.train.seq_len, 8,
                        torch.Generator().manual_seed(seed))

    dtype = torch.float64 if device.type == "cpu" else torch.float32  # decode.py NOTE [Exactness]
    target64, head64 = target.to(dtype), head.to(dtype)
    contexts = []
    for c in spec.contexts:
        log(f"decoding at context {c}: dense and {len(spec.keysets)} draft arms")
        prompt = tokens["test"][:c].to(device)
        contexts.append(run_arms(target64, head64, prompt, preset))

    log("timing draft attention alone per key set")
    attn = bench_draft_attention(preset.model, spec.contexts, spec.keysets, repeats=max(spec.repeats, 20) * 5,
                                 dtype=dtype, device=device, seed=seed)
    metrics = {
        "schema_version": SCHEMA_VERSION,
        "paper": "windowed-mtp (arXiv 2607.21535)",
        "command": command,
        "seed": seed,
        "corpus": {"name": corpus.name, "source": corpus.source, "message": corpus.message,
                   "fingerprint": corpus.fingerprint, "tokens": {k: int(v.numel()) for k, v in tokens.items()}},
        "config": {"preset": preset.name, "model": asdict(preset.model), "mtp": asdict(preset.mtp),
                   "train": asdict(preset.train), "spec": asdict(preset.spec)},
        "decode_dtype": str(dtype).removeprefix("torch."),
        "environment": environment(device),
        "training": {k: v for k, v in train_info.items() if not k.endswith("losses")}
        | {k: v[-1] if v else None for k, v in train_info.items() if k.endswith("losses")},  # None: 0 steps
        "target_perplexity": {"valid_tokens_scored": ppl_tokens, "by_context": ppl},
        "head_top1_accuracy_teacher_forced": acc,
        "contexts": contexts,
        "draft_attention": attn,
        "bars": {"draft_attention_16k_sink8_win64": draft_attention_bar(attn, device)},
        "lossless": "asserted: every arm's tokens equal the dense greedy tokens (torch.equal)",
        "wall_time_s": time.perf_counter() - t_start,
    }
    if out is not None:
        write_json(out, metrics)
    return metrics
