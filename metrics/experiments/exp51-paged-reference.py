"""Experiment 51: the paged reference's windowed draft call against the context length, with the code
of several revisions side by side, rounds alternating (as experiment 49).

Usage: python3 metrics/experiments/exp51-paged-reference.py OUT.json ROUNDS CHECKOUT [CHECKOUT ...]
(the side-by-side runs: metrics/experiments/revisions.py)

Each CHECKOUT is a directory holding a revision (``git worktree add DIR REV``); each round runs, in a
subprocess with that checkout first on ``sys.path``, ``wmtp.paged_attention(..., impl="torch")`` for one
draft query with 8 sinks + a window of 64 over a paged cache (pages of 16, randomly permuted) of
16384 and of 1048576 positions: the small preset's draft shapes (Hq = Hkv = 4, D = 64), float64,
200 timed calls after 20 untimed ones. Reported per run: the median per context.
"""

from __future__ import annotations

import sys
from pathlib import Path

from revisions import alternate, write

RUN = """
import json, statistics, sys, time, torch
sys.path.insert(0, sys.argv[1])
import wmtp
assert wmtp.__file__.startswith(sys.argv[1]), wmtp.__file__
g = torch.Generator().manual_seed(0)
medians = {}
for S in (16384, 1 << 20):
    n_pages = S // 16
    k_pages, v_pages = (torch.randn(n_pages, 16, 4, 64, generator=g, dtype=torch.float64) for _ in range(2))
    table = torch.randperm(n_pages, generator=g).to(torch.int32)[None]  # (1, n_pages)
    q, pos = torch.randn(1, 4, 1, 64, generator=g, dtype=torch.float64), torch.tensor([S - 1])
    call = lambda: wmtp.paged_attention(q, k_pages, v_pages, table, pos, 8, 64, impl="torch")
    for _ in range(20):
        call()
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    medians[str(S)] = statistics.median(times)
print(json.dumps(medians))
"""


def main(argv: list[str]) -> int:
    out, rounds, checkouts = Path(argv[0]), int(argv[1]), [Path(a).resolve() for a in argv[2:]]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from wmtp.metrics import environment

    runs = alternate(RUN, rounds, checkouts, lambda m: ", ".join(f"{s}: {t * 1e6:.1f} us" for s, t in m.items()))
    write(out, {"experiment": 51, "command": "python3 metrics/experiments/exp51-paged-reference.py " + " ".join(argv),
                "environment": environment("cpu"), "dtype": "float64", "page_size": 16, "n_sink": 8, "window": 64,
                "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
