"""Experiment 52: how many ATen ops one draft-attention call dispatches, per revision (the count that
NOTE [Batched matmuls] in wmtp/attention/reference.py quotes).

Usage: python3 metrics/experiments/exp52-aten-ops.py OUT.json CHECKOUT [CHECKOUT ...]

Each CHECKOUT is a directory holding a revision (``git worktree add DIR REV``), run in its own
subprocess with that checkout first on ``sys.path``. The call is experiment 49's 8 + 64 draft call:
one query at position 16383 of a 16384-key cache, the small preset's draft shapes, float64, on the
CPU, once to warm up and once counted. An op is what a ``TorchDispatchMode`` sees: every ATen op that
reaches a kernel (views and ``item`` included), for the reference alone (``attention_torch``) and for
the public op (``wmtp.attention(..., impl="torch")``, its argument checks included).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from revisions import revision, write

RUN = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import wmtp
from torch.utils._python_dispatch import TorchDispatchMode
from wmtp.attention.reference import attention_torch
from wmtp.config import get_preset
assert wmtp.__file__.startswith(sys.argv[1]), wmtp.__file__

class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))

m, S = get_preset("small").model, 16384
g = torch.Generator().manual_seed(42)
q = torch.randn(1, m.n_heads, 1, m.head_dim, generator=g, dtype=torch.float64)  # (1, Hq, 1, D)
k = torch.randn(1, m.n_kv_heads, S, m.head_dim, generator=g, dtype=torch.float64)  # (1, Hkv, S, D)
v = torch.randn(1, m.n_kv_heads, S, m.head_dim, generator=g, dtype=torch.float64)  # (1, Hkv, S, D)
pos = torch.tensor([S - 1])
calls = {"attention_torch": lambda: attention_torch(q, k, v, pos, 8, 64),
         "wmtp.attention": lambda: wmtp.attention(q, k, v, pos, 8, 64, impl="torch")}
counts = {}
for name, call in calls.items():
    call()
    with Count() as c:
        call()
    counts[name] = {"n_ops": len(c.ops), "ops": c.ops}
print(json.dumps(counts))
"""


def main(argv: list[str]) -> int:
    out, checkouts = Path(argv[0]), [Path(a).resolve() for a in argv[1:]]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from wmtp.metrics import environment

    runs = []
    for c in checkouts:
        got = subprocess.run([sys.executable, "-c", RUN, str(c)], capture_output=True, text=True, check=True)
        counts = json.loads(got.stdout.strip().splitlines()[-1])
        runs.append({"checkout": str(c), "revision": revision(c), "counts": counts})
        print(revision(c)[:7], {name: n["n_ops"] for name, n in counts.items()}, flush=True)
    write(out, {"experiment": 52, "command": "python3 metrics/experiments/exp52-aten-ops.py " + " ".join(argv),
                "environment": environment("cpu"), "context": 16384, "keyset": "sink8+win64", "dtype": "float64",
                "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
