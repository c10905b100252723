"""Experiment 25: decoding in the CUDA-graph loop with every RMSNorm as one Triton kernel
(wmtp/rmsnorm.py, the model's ``op_impl``) against the reference's six kernels, side by side in
one run on the H200.

The models and prompts are experiment 22's bundle (the small preset trained on WikiText-2; see
metrics/experiments/exp22-gate.py ``bundle``). Per context: one prefill, then three rounds of, for
each variant in turn (``torch_norm``: ``wmtp.model.op_impl`` patched to the reference, the code
before this change; ``triton_norm``: as committed): dense greedy decoding and the arms (native,
64 + 4096, 8 + 64; fixed depth 7), each asserted token-equal to that round's dense tokens (the
variants' dense tokens may differ in a near-tie, since the norms round differently; each arm is
checked against its own variant's). The context's one prefill runs with the Triton norms and
serves both variants. Figures: bench depth's ``tpot_s`` (the steps' device seconds
over the tokens they kept) and each phase's seconds a step, medians of the rounds.

Run at d52d2c9, when ``op_impl`` was named ``norm_impl`` and chose the norms' impl alone. Since
RoPE became a kernel too (wmtp/rope.py) it chooses both ops' impl, so a re-run at a later revision
compares the reference norms *and* RoPE against both kernels (experiment 26 patches RoPE alone).

Usage: python3 metrics/experiments/exp25-fused-norm.py BUNDLE_DIR OUT.json [CONTEXT ...]
"""

import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

import wmtp
from wmtp import bench_depth
from wmtp import model as model_mod
from wmtp import mtp as mtp_mod
from wmtp.bench_common import loop_generators, timed_prefill, with_capacity
from wmtp.config import KeySetConfig, get_preset
from wmtp.metrics import environment, write_json
from wmtp.policy import FixedDepth

if model_mod.Block.__module__ != "wmtp.model":  # side_by_side.stale_since's rule, for a script without it
    sys.exit("since 91169fb the blocks live in wmtp/block.py and look op_impl up there, so this script's variants "
             "would run the same code; run it at the revision its JSON's code_revision names (metrics/README.md)")
VARIANTS = {"torch_norm": lambda impl, device: "torch", "triton_norm": model_mod.op_impl}
bundle_dir, out = sys.argv[1], sys.argv[2]
contexts = [int(c) for c in sys.argv[3:]] or [1024, 16384, 131072]
dev = torch.device("cuda")
blob = torch.load(Path(bundle_dir) / "bundle.pt", weights_only=True)
keysets = (KeySetConfig(0, None), KeySetConfig(64, 4096), KeySetConfig(8, 64))
base = get_preset("small")
preset = dataclasses.replace(base, spec=dataclasses.replace(base.spec, keysets=keysets))
K, new, rounds = preset.spec.depth, preset.spec.new_tokens, 3
target, head = wmtp.build_models("small", seed=0)
target.load_state_dict(blob["target"])
head.load_state_dict(blob["head"])
target, head = with_capacity(target.to(dev).float(), head.to(dev).float(), max(contexts) + new + K)
greedy = loop_generators("graph")[0]
result = {"experiment": 25, "command": " ".join(["python3", sys.argv[0], "BUNDLE_DIR", "OUT.json", *sys.argv[3:]]),
          "environment": environment(dev), "dtype": "float32", "loop": "graph", "checkpoint": blob["meta"],
          "spec": dataclasses.asdict(preset.spec), "rounds": rounds, "policy": "fixed-7", "variants": list(VARIANTS),
          "tpot": bench_depth.TPOT_NOTE, "rows": []}
for c in contexts:
    prompt = blob["prompt"][-c:].to(dev)
    pre, prefill_s = timed_prefill(target, head, prompt, preset)
    runs = {v: {"dense": [], **{ks.label: [] for ks in keysets}} for v in VARIANTS}
    t0 = time.perf_counter()
    for _ in range(rounds):
        for v, chooser in VARIANTS.items():
            model_mod.op_impl = mtp_mod.op_impl = chooser
            steps: list[float] = []
            dense = greedy(target, prompt, new, step_times=steps, prefill=pre)
            runs[v]["dense"].append({"tpot_s": statistics.fmean(steps), "ids": dense.tolist()})
            for ks in keysets:
                r = bench_depth.one_run(target, head, prompt, preset, ks, "fixed-7", FixedDepth(K), dense, pre,
                                        "graph")
                runs[v][ks.label].append(r | {"draft_s_per_step": r["draft_s"] / r["steps"],
                                              "verify_s_per_step": r["verify_s"] / r["steps"]})
    model_mod.op_impl = mtp_mod.op_impl = VARIANTS["triton_norm"]
    row = {"context": c, "prefill_s": prefill_s, "seconds": time.perf_counter() - t0, "variants": {}}
    ids = {tuple(d["ids"]) for v in VARIANTS for d in runs[v]["dense"]}
    row["dense_tokens_equal_across_variants"] = len(ids) == 1
    for v in VARIANTS:
        arms = {"dense": {"tpot_s": statistics.median(d["tpot_s"] for d in runs[v]["dense"])}}
        for ks in keysets:
            rs = runs[v][ks.label]
            arms[ks.label] = {k: rs[0][k] for k in ("steps", "committed", "accepted", "mean_accept_length")} | {
                k: statistics.median(r[k] for r in rs) for k in ("tpot_s", "draft_s_per_step", "verify_s_per_step")}
            arms[ks.label]["tpot_s_rounds"] = [r["tpot_s"] for r in rs]
        row["variants"][v] = arms
    old, new_ = row["variants"]["torch_norm"], row["variants"]["triton_norm"]
    row["tpot_reduction"] = {a: 1 - new_[a]["tpot_s"] / old[a]["tpot_s"] for a in old}
    row["verify_reduction"] = {a: 1 - new_[a]["verify_s_per_step"] / old[a]["verify_s_per_step"]
                               for a in old if a != "dense"}
    row["draft_reduction"] = {a: 1 - new_[a]["draft_s_per_step"] / old[a]["draft_s_per_step"]
                              for a in old if a != "dense"}
    row["tpot_speedup_vs_dense"] = {v: {a: row["variants"][v]["dense"]["tpot_s"] / row["variants"][v][a]["tpot_s"] - 1
                                        for a in old if a != "dense"} for v in VARIANTS}
    result["rows"].append(row)
    write_json(out, result)
    print(c, {v: {a: round(x["tpot_s"] * 1e3, 4) for a, x in row["variants"][v].items()} for v in VARIANTS},
          {a: round(x, 3) for a, x in row["tpot_reduction"].items()}, flush=True)
