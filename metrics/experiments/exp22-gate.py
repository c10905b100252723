"""Experiment 22: context gating (``gated_key_set``, wmtp/policy.py) in the CUDA-graph loop on the H200.

The models are reproduce's small preset trained on WikiText-2 (the shared valid+test files; the
checkpoint `wmtp bench depth --dataset-dir ../shared/data/wikitext-2 --seed 42` trains on the CPU),
and the prompt is that bench's (``long_prompt``: the last tokens of the corpus's splits end to end).
The GPU machine has no ``datasets`` to read the corpus with, so ``bundle`` (run on the CPU machine)
writes the checkpoint's weights and the longest prompt's token ids to one folder, carried to the GPU
machine as an ignored path, and ``run`` (there) decodes from it.

Per context: one prefill, then ``--rounds`` rounds of dense greedy decoding and every arm (native,
the paper's 64 + 4096, 8 + 64, and 8 + 64 gated at each ``--gates``), each with the paper's fixed
depth 7, in wmtp/static_decode.py's CUDA graphs (device times), float32, Triton (off CUDA: a smoke test in
the eager loop, float64), every run asserted
token-equal to the round's dense tokens (``bench_depth.one_run``). The figure is bench depth's
``tpot_s``: the decode steps' device seconds over the tokens they committed, median of the rounds.

Usage:
    python3 metrics/experiments/exp22-gate.py bundle CACHE_DIR BUNDLE_DIR [CONTEXT]   (CPU machine)
    python3 metrics/experiments/exp22-gate.py run BUNDLE_DIR OUT.json [CONTEXT ...] (GPU machine)
"""

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import wmtp
from wmtp import bench_depth, data, tokenizer
from wmtp.bench_common import long_prompt, loop_generators, timed_prefill, with_capacity
from wmtp.config import KeySetConfig, get_preset
from wmtp.metrics import environment, write_json
from wmtp.policy import FixedDepth
from wmtp.train import checkpoint_meta

PRESET, SEED, DATASET = get_preset("small"), 42, "../shared/data/wikitext-2"
GATES = (8192, 32768)


def bundle(cache_dir: str, out_dir: str, context: int = 131072) -> None:
    corpus = data.load_corpus(DATASET, max_chars=PRESET.train.max_train_chars)
    tok = tokenizer.train_tokenizer(corpus, PRESET.model.vocab_size, Path(cache_dir))
    prompt = long_prompt(tokenizer.corpus_token_splits(corpus, tok), context)
    meta = checkpoint_meta(PRESET, corpus.name, corpus.fingerprint, SEED)
    (ckpt,) = Path(cache_dir).glob(f"ckpt-small-{corpus.name}-seed{SEED}-*.pt")
    blob = torch.load(ckpt, weights_only=True)
    assert blob["meta"] == meta, "the checkpoint is not the small preset's on this corpus and seed"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"meta": meta, "target": blob["target"], "head": blob["head"], "prompt": prompt}, out / "bundle.pt")
    print(f"{out / 'bundle.pt'}: {ckpt.name}, a prompt of {prompt.numel()} tokens")


def run(bundle_dir: str, out: str, contexts: list[int], rounds: int = 3) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: a smoke test, eager, float64
    loop, dtype = ("graph", torch.float32) if dev.type == "cuda" else ("eager", torch.float64)
    blob = torch.load(Path(bundle_dir) / "bundle.pt", weights_only=True)
    keysets = (KeySetConfig(0, None), KeySetConfig(64, 4096), KeySetConfig(8, 64),
               *(KeySetConfig(8, 64, gate=g) for g in GATES))
    preset = dataclasses.replace(PRESET, spec=dataclasses.replace(PRESET.spec, keysets=keysets))
    target, head = wmtp.build_models("small", seed=0)
    target.load_state_dict(blob["target"])
    head.load_state_dict(blob["head"])
    K, new = preset.spec.depth, preset.spec.new_tokens
    target, head = with_capacity(target.to(dev, dtype), head.to(dev, dtype), max(contexts) + new + K)
    result = {"experiment": 22, "command": " ".join(["python3", sys.argv[0], *sys.argv[1:]]),
              "environment": environment(dev), "dtype": str(dtype)[6:], "loop": loop,
              "checkpoint": blob["meta"], "spec": dataclasses.asdict(preset.spec), "rounds": rounds,
              "policy": "fixed-7", "tpot": bench_depth.TPOT_NOTE, "rows": []}
    greedy = loop_generators(loop)[0]
    for c in contexts:
        prompt = blob["prompt"][-c:].to(dev)
        pre, prefill_s = timed_prefill(target, head, prompt, preset)
        runs = {ks.label: [] for ks in keysets}
        dense_tpots = []
        t0 = time.perf_counter()
        for _ in range(rounds):
            steps: list[float] = []
            dense = greedy(target, prompt, new, step_times=steps, prefill=pre)
            dense_tpots.append(statistics.fmean(steps))
            for ks in keysets:
                runs[ks.label].append(bench_depth.one_run(target, head, prompt, preset, ks, "fixed-7", FixedDepth(K),
                                                          dense, pre, loop))
        row = {"context": c, "prefill_s": prefill_s, "seconds": time.perf_counter() - t0,
               "dense": {"tpot_s": statistics.median(dense_tpots), "tpot_s_rounds": dense_tpots}, "arms": {}}
        for ks in keysets:
            rs = runs[ks.label]
            row["arms"][ks.label] = rs[0] | {"n_sink": ks.n_sink, "window": ks.window, "gate": ks.gate,
                                             "tpot_s": statistics.median(r["tpot_s"] for r in rs),
                                             "tpot_s_rounds": [r["tpot_s"] for r in rs]}
        best = min(("native", "sink64+win4096", "sink8+win64"), key=lambda a: row["arms"][a]["tpot_s"])
        row["best_ungated"] = best
        for g in GATES:
            arm = row["arms"][f"sink8+win64+gate{g}"]
            arm["tpot_vs_best_ungated"] = arm["tpot_s"] / row["arms"][best]["tpot_s"] - 1
        result["rows"].append(row)
        write_json(out, result)
        print(json.dumps({"context": c, "best": best, **{a: round(v["tpot_s"] * 1e3, 4) for a, v in
                                                          row["arms"].items()}}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "bundle":
        bundle(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:]))
    else:
        run(sys.argv[2], sys.argv[3], [int(c) for c in sys.argv[4:]] or [1024, 4096, 16384, 65536, 131072])
