"""Experiment 48: a prefill as the code did before session 25 and as it does now, side by side in one
run: NOTE [Logits at] in wmtp/model.py (the target's LM head at each prompt's last position only)
and NOTE [Shared draft prefill] in wmtp/prefill.py (the MTP head's prefill writes its keys and
values alone: ``MTPHead.write_cache``, no attention, MLP or LM head).

The small preset's target and head (random weights), float32, run ``wmtp.rows.prefill_rows`` for B
prompts of P tokens in three variants: ``before`` patches ``TargetLM.final`` to take the LM head
over every position and pick the last rows after, and ``MTPHead.write_cache`` to run the head's
forward (each position reading itself) and drop its outputs, as the code did; ``logits_at`` only
the second patch; ``after`` is the committed code. Per (P, B) and round each variant runs once (the
order rotating), timed wall-clock after a synchronize, after one untimed warm-up each. Reported:
medians, ms a prompt, each variant's speedup over ``before`` (old/new - 1), on CUDA each variant's
peak allocated memory above what was allocated before the run and its reduction from ``before``'s
(1 - new/old), whether the first new tokens, the last hidden states and the draft caches equal
``before``'s, and the draft caches' largest difference from ``before``'s.

A second part (``native_own_rows``) times one prompt's own prefill of a native-draft run
(``speculative_generate`` without a shared prefill, ``_run_prefill`` in wmtp/prefill.py): ``before``
with the head's whole forward over every earlier key, as such a run did, against ``after``.

Usage: python3 metrics/experiments/exp48-prefill-logits.py OUT.json DEVICE ROUNDS [P ...]
"""

import statistics
import sys
import time

import torch

import wmtp
from wmtp.device import synchronize
from wmtp.metrics import environment, write_json
from wmtp.model import TargetLM
from wmtp.mtp import MTPHead
from wmtp.prefill import _run_prefill
from wmtp.rows import prefill_rows

out, device, ROUNDS = sys.argv[1], torch.device(sys.argv[2]), int(sys.argv[3])
LENGTHS = [int(p) for p in sys.argv[4:]] or [1024, 16384]
BATCHES = [1, 4, 16]
IMPL = "triton" if device.type == "cuda" else "torch"
target, head = wmtp.build_models("small", seed=0)
target, head = target.to(device, torch.float32).eval(), head.to(device, torch.float32).eval()
FINAL, WRITE = TargetLM.final, MTPHead.write_cache


def every_position(self, x, pending, impl="torch", logits_at=None):
    """The target's LM head over every position, the asked-for rows picked after."""
    logits, hidden = FINAL(self, x, pending, impl)  # (B, L, V), (B, L, d)
    if logits_at is not None:
        logits = logits.gather(1, logits_at[:, :, None].expand(-1, -1, logits.shape[-1]))  # (B, n, V)
    return logits, hidden


def head_forward(self, hidden, next_ids, pos, cache, impl="auto"):
    """The MTP head's whole forward, each position reading only itself, its outputs dropped."""
    self(hidden, next_ids, pos, cache, 0, 1, impl)


def native_forward(self, hidden, next_ids, pos, cache, impl="auto"):
    """The MTP head's whole forward over every earlier key (the native draft's key set), its outputs
    dropped: a native run's own prefill before session 25."""
    self(hidden, next_ids, pos, cache, None, None, impl)


VARIANTS = {"before": (every_position, head_forward), "logits_at": (FINAL, head_forward), "after": (FINAL, WRITE)}
NATIVE = {"before": (every_position, native_forward), "after": (FINAL, WRITE)}


def run(variants, variant, call):
    """One timed ``call()`` (returning the first tokens, last hidden states and draft cache) with
    ``variants[variant]`` patched in: seconds, peak allocated bytes above the start (CUDA), outputs."""
    TargetLM.final, MTPHead.write_cache = variants[variant]
    try:
        with torch.no_grad():
            synchronize(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            t0 = time.perf_counter()
            x, h, dcache = call()
            synchronize(device)
            seconds = time.perf_counter() - t0
            peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
            return seconds, peak, x, h, dcache
    finally:
        TargetLM.final, MTPHead.write_cache = FINAL, WRITE


def measure(variants, call, **cell):
    """Every variant once untimed (compiles), then ``ROUNDS`` rounds in rotating order: a row."""
    outs = {v: run(variants, v, call) for v in variants}
    seconds, peaks = {v: [] for v in variants}, {v: [] for v in variants}
    names = list(variants)
    for r in range(ROUNDS):
        for v in names[r % len(names):] + names[: r % len(names)]:
            t, peak, *_ = run(variants, v, call)
            seconds[v].append(t)
            peaks[v].append(peak)
    med = {v: statistics.median(t) for v, t in seconds.items()}
    peak = {v: max(p) if p[0] is not None else None for v, p in peaks.items()}
    _, _, x0, h0, d0 = outs["before"]
    row = {**cell, "seconds_rounds": seconds,
           "median_ms": {v: t * 1e3 for v, t in med.items()},
           "median_ms_a_prompt": {v: t * 1e3 / cell.get("batch", 1) for v, t in med.items()},
           "speedup_over_before": {v: med["before"] / t - 1 for v, t in med.items()},
           "peak_allocated_bytes": peak,
           "peak_reduction_from_before": {v: None if p is None else 1 - p / peak["before"] for v, p in peak.items()},
           "first_tokens_equal_before": {v: bool(torch.equal(o[2], x0)) for v, o in outs.items()},
           "last_hidden_equal_before": {v: bool(torch.equal(o[3], h0)) for v, o in outs.items()},
           "draft_cache_equal_before": {v: bool(torch.equal(o[4].k, d0.k) and torch.equal(o[4].v, d0.v))
                                        for v, o in outs.items()},
           "draft_cache_max_abs_diff_before": {v: max(float((o[4].k - d0.k).abs().max()),
                                                      float((o[4].v - d0.v).abs().max())) for v, o in outs.items()}}
    print(cell, {v: round(t, 2) for v, t in row["median_ms"].items()},
          {v: f"{t:+.1%}" for v, t in row["speedup_over_before"].items()}, "peak", peak,
          "equal", row["first_tokens_equal_before"], row["draft_cache_equal_before"], flush=True)
    return row


def batched(rows, P):
    _, dcache, x, h, _ = prefill_rows(target, head, rows, P, IMPL)
    return x, h, dcache


def own(prompt):
    got = _run_prefill(target, head, prompt, prompt.numel(), IMPL, True)
    return got.logits.argmax(), got.hidden, got.draft_cache


gen = torch.Generator().manual_seed(48)
result = {"experiment": 48, "command": " ".join(["python3", sys.argv[0], "OUT.json", *sys.argv[2:]]),
          "environment": environment(device), "preset": "small", "dtype": "float32", "impl": IMPL,
          "weights": "random (seed 0)", "rounds": ROUNDS, "warmup_rounds": 1, "rows": [], "native_own_rows": []}
for P in LENGTHS:
    for B in BATCHES:
        rows = list(torch.randint(0, target.config.vocab_size, (B, P), generator=gen).to(device))
        result["rows"].append(measure(VARIANTS, lambda: batched(rows, P), prompt_tokens=P, batch=B))
for P in LENGTHS:
    prompt = torch.randint(0, target.config.vocab_size, (P,), generator=gen).to(device)
    result["native_own_rows"].append(measure(NATIVE, lambda: own(prompt), prompt_tokens=P, batch=1))
write_json(out, result)
