"""Side by side across revisions, on the CPU (experiments 49-51): one timing snippet run in a fresh
subprocess per checkout, every checkout once a round, rounds alternating, so the machine's drift hits
each revision alike. A checkout is a directory holding a revision (``git worktree add DIR REV``); the
snippet gets it as ``sys.argv[1]``, puts it first on ``sys.path`` and prints one JSON line, its medians.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def revision(checkout: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def alternate(code: str, rounds: int, checkouts: list[Path], show: Callable[[dict], str]) -> list[dict]:
    """``rounds`` x each checkout: ``{"round", "checkout", "revision", "median_s"}`` per run, the snippet's
    JSON as ``median_s``; each printed as it ends, with ``show(median_s)``."""
    runs = []
    for r in range(rounds):
        for c in checkouts:
            got = subprocess.run([sys.executable, "-c", code, str(c)], capture_output=True, text=True, check=True)
            medians = json.loads(got.stdout.strip().splitlines()[-1])
            runs.append({"round": r, "checkout": str(c), "revision": revision(c), "median_s": medians})
            print(f"round {r} {runs[-1]['revision'][:7]}: {show(medians)}", flush=True)
    return runs


def write(out: Path, doc: dict) -> None:
    """``doc`` as JSON at ``out``, through a temporary file and a rename (nothing half-written)."""
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
