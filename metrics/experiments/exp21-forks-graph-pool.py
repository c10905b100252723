"""Experiment 21: the GPU memory a CUDA-graph speculative run adds, (a) with every capture in one
memory pool (NOTE [One graph pool], wmtp/graphs.py) against a pool per graph, and (b) from a paged
prefill whose run forks its caches (NOTE [Forks], wmtp/pagedcache.py) against one that copies them.
Preset small, random weights (memory and times do not depend on them), float32, Triton, the graph
loop (static_speculative_generate), key set 64 + 4096, depths drawn at random from 1..7 each step (so
most (extend rows, depth) pairs are captured), two rounds of the arms interleaved. Every run is
asserted token-equal to the graph loop's dense greedy decoding from the same prefill. Recorded per
run: the peak allocated and reserved bytes it adds over what was held before it, the graphs it
captured and the distinct pools they went to, the median draft and verify phase times.
Usage: python3 metrics/experiments/exp21-forks-graph-pool.py OUT.json [CONTEXT ...]"""
import json
import random
import statistics
import subprocess
import sys
import time

import torch

import wmtp
from wmtp import prefill as prefill_mod
from wmtp import static_decode
from wmtp.bench_decode import with_capacity
from wmtp.metrics import environment

contexts = [int(c) for c in sys.argv[2:]] or [131072]
dev = torch.device("cuda")
new, K, n_sink, window = 64, 7, 64, 4096
target, head = wmtp.build_models("small", seed=0)
target, head = with_capacity(target.to(dev).float(), head.to(dev).float(), max(contexts) + new + K)
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
result = {"experiment": 21, "command": " ".join(["python3", *sys.argv[:1], "OUT.json", *sys.argv[2:]]),
          "environment": environment(dev), "dtype": "float32", "preset": "small (random weights)",
          "new_tokens": new, "max_depth": K, "n_sink": n_sink, "window": window, "page_size": 16,
          "code_revision_note": f"device checkout's git says {rev!r} (stale on the device); see the commit message",
          "rows": []}


class RandomDepths:
    """Depths drawn uniformly from 1..max_depth, seeded."""

    def __init__(self, max_depth, seed):
        self.max_depth, self.rng = max_depth, random.Random(seed)

    def depth(self, position):
        return self.rng.randint(1, self.max_depth)

    def update(self, depth, accepted, draft_s, verify_s):
        pass


runner, fork_or_copy, shared_pool = static_decode.runner, prefill_mod._run_cache, static_decode.graph_pool
captured = []


def counting_runner(step, state, graph, pool=None):
    captured.append(id(pool) if pool is not None else None)
    return runner(step, state, graph, pool)


static_decode.runner = counting_runner
ARMS = {  # name: (prefill, pool per run?, fork a paged prefill?)
    "contiguous copy, one pool": ("contiguous", True, True),
    "contiguous copy, a pool per graph": ("contiguous", False, True),
    "paged copy, one pool": ("paged", True, False),
    "paged fork, one pool": ("paged", True, True),
}
g = torch.Generator().manual_seed(0)
for S in contexts:
    prompt = torch.randint(0, target.config.vocab_size, (S,), generator=g).to(dev)
    row, pres = {"context": S, "prefill_s": {}, "runs": []}, {}
    for name, page_size in (("contiguous", None), ("paged", 16)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pres[name] = wmtp.prefill_prompt(target, prompt, S + new + K, draft=head, impl="triton", page_size=page_size)
        torch.cuda.synchronize()
        row["prefill_s"][name] = time.perf_counter() - t0
    dense = {name: wmtp.static_greedy_generate(target, prompt, new, impl="triton", prefill=pre)
             for name, pre in pres.items()}
    for rnd in range(2):
        for arm, (which, one_pool, fork) in ARMS.items():
            static_decode.graph_pool = shared_pool if one_pool else (lambda: None)
            prefill_mod._run_cache = fork_or_copy if fork else (lambda c, filled, needed, checked: c.copy(checked))
            captured.clear()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            alloc0, reserved0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            t0 = time.perf_counter()
            out, stats = wmtp.static_speculative_generate(target, head, prompt, new, RandomDepths(K, rnd), n_sink,
                                                          window, impl="triton", prefill=pres[which])
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            assert torch.equal(out, dense[which]), (S, arm, rnd)
            r = {"round": rnd, "arm": arm, "lossless": True, "wall_s": wall, "steps": stats.steps,
                 "steps_by_depth": stats.steps_by_depth, "graphs": len(captured),
                 "pools": len(set(captured)) if one_pool else len(captured),
                 "peak_added_allocated_bytes": torch.cuda.max_memory_allocated() - alloc0,
                 "peak_added_reserved_bytes": torch.cuda.max_memory_reserved() - reserved0,
                 "draft_kv_bytes": stats.draft_kv_bytes,
                 "draft_s_median": statistics.median(stats.draft_times_s),
                 "verify_s_median": statistics.median(stats.verify_times_s)}
            row["runs"].append(r)
            print(S, {k: v for k, v in r.items() if k != "steps_by_depth"}, flush=True)
            del out, stats
    result["rows"].append(row)
    del pres
with open(sys.argv[1], "w") as f:
    json.dump(result, f, indent=1)
