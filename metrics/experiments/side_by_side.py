"""The side-by-side decoding loop of experiments 26 on: variants of one op, each a patch of the code,
timed in the CUDA-graph loop in one run on the H200 (experiments 24 and 25 carry their own copy of it).

The models and prompts are experiment 22's bundle (the small preset trained on WikiText-2; see
metrics/experiments/exp22-gate.py ``bundle``). Per context: one prefill (with the code as committed),
then ``rounds`` rounds of, for each variant in turn: dense greedy decoding and the arms (native,
64 + 4096, 8 + 64; fixed depth 7), each asserted token-equal to that round's dense tokens of the same
variant (variants' dense tokens may differ in a near-tie, since they round differently; the JSON says
whether they did). Figures: bench depth's ``tpot_s`` (the steps' device seconds over the tokens they
kept) and each phase's seconds a step, medians of the rounds; the last variant against the first as
reductions (1 - new/old) and each variant's arms against its dense decoding as speedups (old/new - 1).
"""

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import wmtp
from wmtp import bench_depth
from wmtp.bench_common import loop_generators, timed_prefill, with_capacity
from wmtp.config import KeySetConfig, get_preset
from wmtp.metrics import environment, write_json
from wmtp.policy import FixedDepth


def stale_since(stale: bool, revision: str, why: str) -> None:
    """Stop a script whose variants would run the same code: the code no longer takes the path it
    patches (``stale``) since ``revision``. Its committed JSON names the revision it ran at."""
    if stale:
        sys.exit(f"since {revision} {why}, so this script's variants would run the same code; run it at the "
                 "revision its JSON's code_revision names (metrics/README.md)")


def _arms(runs: dict, keysets) -> dict:
    arms = {"dense": {"tpot_s": statistics.median(d["tpot_s"] for d in runs["dense"])}}
    for ks in keysets:
        rs = runs[ks.label]
        arms[ks.label] = {k: rs[0][k] for k in ("steps", "committed", "accepted", "mean_accept_length")} | {
            k: statistics.median(r[k] for r in rs) for k in ("tpot_s", "draft_s_per_step", "verify_s_per_step")}
        arms[ks.label]["tpot_s_rounds"] = [r["tpot_s"] for r in rs]
    return arms


def run(experiment: int, variants: dict[str, Callable[[], None]], argv: list[str], rounds: int = 3,
        extra: dict | None = None) -> dict:
    """Time ``variants`` (name -> a function that patches the code into that variant; the last one
    must restore the code as committed) side by side. ``argv``: the script's
    ``[script, BUNDLE_DIR, OUT.json, CONTEXT ...]``; the JSON is rewritten after every context."""
    bundle_dir, out = argv[1], argv[2]
    contexts = [int(c) for c in argv[3:]] or [1024, 16384, 131072]
    names = list(variants)
    dev = torch.device("cuda")
    blob = torch.load(Path(bundle_dir) / "bundle.pt", weights_only=True)
    keysets = (KeySetConfig(0, None), KeySetConfig(64, 4096), KeySetConfig(8, 64))
    base = get_preset("small")
    preset = dataclasses.replace(base, spec=dataclasses.replace(base.spec, keysets=keysets))
    K, new = preset.spec.depth, preset.spec.new_tokens
    target, head = wmtp.build_models("small", seed=0)
    target.load_state_dict(blob["target"])
    head.load_state_dict(blob["head"])
    target, head = with_capacity(target.to(dev).float(), head.to(dev).float(), max(contexts) + new + K)
    greedy = loop_generators("graph")[0]
    result = {"experiment": experiment, "command": " ".join(["python3", argv[0], "BUNDLE_DIR", "OUT.json", *argv[3:]]),
              "environment": environment(dev), "dtype": "float32", "loop": "graph", "checkpoint": blob["meta"],
              "spec": dataclasses.asdict(preset.spec), "rounds": rounds, "policy": "fixed-7", "variants": names,
              "tpot": bench_depth.TPOT_NOTE, **(extra or {}), "rows": []}
    for c in contexts:
        prompt = blob["prompt"][-c:].to(dev)
        variants[names[-1]]()
        pre, prefill_s = timed_prefill(target, head, prompt, preset)
        runs = {v: {"dense": [], **{ks.label: [] for ks in keysets}} for v in names}
        t0 = time.perf_counter()
        for _ in range(rounds):
            for v, patch in variants.items():
                patch()
                steps: list[float] = []
                dense = greedy(target, prompt, new, step_times=steps, prefill=pre)
                runs[v]["dense"].append({"tpot_s": statistics.fmean(steps), "ids": dense.tolist()})
                for ks in keysets:
                    r = bench_depth.one_run(target, head, prompt, preset, ks, "fixed-7", FixedDepth(K), dense, pre,
                                            "graph")
                    runs[v][ks.label].append(r | {"draft_s_per_step": r["draft_s"] / r["steps"],
                                                  "verify_s_per_step": r["verify_s"] / r["steps"]})
        dense_ids = {tuple(d["ids"]) for v in names for d in runs[v]["dense"]}
        row = {"context": c, "prefill_s": prefill_s, "seconds": time.perf_counter() - t0,
               "dense_tokens_equal_across_variants": len(dense_ids) == 1,
               "variants": {v: _arms(runs[v], keysets) for v in names}}
        old, new_ = row["variants"][names[0]], row["variants"][names[-1]]
        spec_arms = [a for a in old if a != "dense"]
        row["tpot_reduction"] = {a: 1 - new_[a]["tpot_s"] / old[a]["tpot_s"] for a in old}
        for phase in ("verify", "draft"):
            row[f"{phase}_reduction"] = {a: 1 - new_[a][f"{phase}_s_per_step"] / old[a][f"{phase}_s_per_step"]
                                         for a in spec_arms}
        row["tpot_speedup_vs_dense"] = {
            v: {a: row["variants"][v]["dense"]["tpot_s"] / row["variants"][v][a]["tpot_s"] - 1 for a in spec_arms}
            for v in names}
        result["rows"].append(row)
        write_json(out, result)
        print(c, {v: {a: round(x["tpot_s"] * 1e3, 4) for a, x in row["variants"][v].items()} for v in names},
              {a: round(x, 3) for a, x in row["tpot_reduction"].items()}, flush=True)
    return result
