"""Experiment 18: the draft's ring-buffer KV at long context (wmtp/ringcache.py; draft_cache="ring").
Preset small, random weights (the head accepts almost nothing; times and bytes do not depend on the
weights), float32, eager loop, one shared prefill of a random prompt per context. Per context and
windowed key set: the full draft KV and the ring, each run asserted token-equal to dense greedy
decoding; recorded: the draft KV's bytes (SpecStats.draft_kv_bytes), the peak GPU memory a run
adds over the prefill's, and the median draft and verify phase times of the steps.
Usage: python3 metrics/experiments/exp18-ring.py OUT.json [CONTEXT ...]"""
import json
import statistics
import sys
import time

import torch

import wmtp
from wmtp.bench_decode import with_capacity
from wmtp.metrics import environment

contexts = [int(c) for c in sys.argv[2:]] or [131072, 1048576]
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
new, depth = 32, 7
target, head = wmtp.build_models("small", seed=0)
target, head = with_capacity(target.to(dev).float(), head.to(dev).float(), max(contexts) + new + depth)
result = {"experiment": 18, "command": " ".join(["python3", *sys.argv[:1], "OUT.json", *sys.argv[2:]]),
          "environment": environment(dev), "dtype": "float32", "preset": "small (random weights)",
          "new_tokens": new, "depth": depth, "rows": []}
g = torch.Generator().manual_seed(0)
for S in contexts:
    prompt = torch.randint(0, target.config.vocab_size, (S,), generator=g).to(dev)
    t0 = time.perf_counter()
    pre = wmtp.prefill_prompt(target, prompt, S + new + depth, draft=head)
    prefill_s = time.perf_counter() - t0
    dense = wmtp.greedy_generate(target, prompt, new, prefill=pre)
    row = {"context": S, "prefill_s": prefill_s, "arms": {}}
    for n_sink, window in [(64, 4096), (8, 64)]:
        for cache in ("full", "ring"):
            if dev.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            out, stats = wmtp.speculative_generate(target, head, prompt, new, depth, n_sink, window, prefill=pre,
                                                   draft_cache=cache)
            assert torch.equal(out, dense), (S, n_sink, window, cache)
            row["arms"][f"sink{n_sink}+win{window} {cache}"] = {
                "lossless": True, "draft_kv_bytes": stats.draft_kv_bytes, "steps": stats.steps,
                "peak_added_bytes": torch.cuda.max_memory_allocated() - base if dev.type == "cuda" else None,
                "draft_s_median": statistics.median(stats.draft_times_s),
                "verify_s_median": statistics.median(stats.verify_times_s)}
            print(S, n_sink, window, cache, row["arms"][f"sink{n_sink}+win{window} {cache}"], flush=True)
    result["rows"].append(row)
    del pre
with open(sys.argv[1], "w") as f:
    json.dump(result, f, indent=1)
