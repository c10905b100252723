"""Experiment 20 (session 13): how much of the draft head's attention its sinks take, with absolute
and with re-indexed key positions (wmtp/keyset.py; metrics/bench-positions-cpu.json found that
re-indexing changes few drafts).

Reproduce's small WikiText-2 models (the checkpoint of ``wmtp bench positions``), the last 16384
tokens of the corpus (the bench's prompt). The target runs once over the prompt; the head's keys
for every position and its queries for the last 64 positions are formed as its attention forms
them (RoPE at absolute positions). Per key set and positions option, per query and head, the
attention weight on the sink keys (``j < n_sink``) is averaged; the native draft's weight on the
first 8 and 64 keys is given for comparison. CPU, float64.

    PYTHONPATH=$PWD python3 metrics/experiments/exp20-sink-mass.py metrics/experiments/sink-mass-cpu-exp20.json
"""

import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from wmtp.bench_common import bench_setup
from wmtp.block import apply_rope  # wmtp.model's until 91169fb
from wmtp.config import get_preset
from wmtp.keyset import draft_key_indices, sink_query_position
from wmtp.metrics import environment

CONTEXT, QUERIES = 16384, 64
KEYSETS = [(8, 64), (64, 4096), (8, 248)]


@torch.no_grad()
def main(path: str) -> None:
    t0 = time.perf_counter()
    preset = get_preset("small")
    setup = bench_setup("exp20", preset, "../shared/data/wikitext-2", torch.device("cpu"), 42, (CONTEXT,),
                        Path(".wmtp-cache"), "exp20", False, print)
    target, head, prompt = setup.target, setup.head, setup.prompts[CONTEXT]
    _, hidden = target(prompt[None])  # (1, P, d)
    P, c = prompt.numel(), target.config
    e = F.embedding(prompt[None, 1:], target.embed)  # (1, P-1, d): the token after each position
    x = F.linear(torch.cat([head.hidden_norm(hidden[:, :-1]), head.embed_norm(e)], -1), head.proj)  # (1, P-1, d)
    attn = head.block.attn
    xn = head.block.attn_norm(x)
    pos = torch.arange(P - 1)
    k = apply_rope(F.linear(xn, attn.wk).view(1, P - 1, c.n_kv_heads, c.head_dim).transpose(1, 2), pos,
                   c.rope_theta)  # (1, Hkv, P-1, D)
    q_raw = F.linear(xn[:, -QUERIES:], attn.wq).view(1, QUERIES, c.n_heads, c.head_dim).transpose(1, 2)
    group = c.n_heads // c.n_kv_heads
    k = k.repeat_interleave(group, 1)  # (1, Hq, P-1, D)
    q_pos = pos[-QUERIES:]

    def sink_mass(n_sink, window, positions):
        masses = []
        for i, t in enumerate(q_pos.tolist()):
            idx = draft_key_indices(t, n_sink, window)
            q = apply_rope(q_raw[:, :, i:i + 1], torch.tensor([t]), c.rope_theta)  # (1, Hq, 1, D)
            s = (q @ k[:, :, idx].transpose(-1, -2)).squeeze(2) / math.sqrt(c.head_dim)  # (1, Hq, n)
            if positions == "reindexed":
                qs = apply_rope(q_raw[:, :, i:i + 1], torch.tensor([sink_query_position(t, n_sink, window)]),
                                c.rope_theta)
                s[..., :n_sink] = (qs @ k[:, :, :n_sink].transpose(-1, -2)).squeeze(2) / math.sqrt(c.head_dim)
            masses.append(torch.softmax(s, -1)[..., :n_sink].sum(-1))  # (1, Hq)
        m = torch.stack(masses)  # (QUERIES, 1, Hq)
        return {"mean": m.mean().item(), "per_head": m.mean((0, 1)).tolist(), "max": m.max().item()}

    res = {"command": "PYTHONPATH=$PWD python3 metrics/experiments/exp20-sink-mass.py "
                      "metrics/experiments/sink-mass-cpu-exp20.json",
           "environment": environment(torch.device("cpu")), "doc": __doc__, "context": CONTEXT,
           "queries": f"positions {P - 1 - QUERIES} .. {P - 2}", "checkpoint": setup.header["checkpoint"],
           "native_first_keys": {n: sink_mass(n, None, "absolute") for n in (8, 64)}, "keysets": []}
    for n_sink, window in KEYSETS:
        res["keysets"].append({"n_sink": n_sink, "window": window,
                               **{p: sink_mass(n_sink, window, p) for p in ("absolute", "reindexed")}})
        print(res["keysets"][-1], flush=True)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
