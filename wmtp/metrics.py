"""Metrics JSON: schema version, environment and provenance, atomic writer; the step-cost model.

Every committed figure names the command, device and versions that made it, so each metrics file
carries ``command`` and ``environment`` (versions, device, git revision); those of runs on
reproduce's models add ``schema_version``, the seed and the ``asdict`` of their configs, and the
kernel sweep (``wmtp bench attention`` on CUDA) its own parameters (dtype, key set, shapes, ...).
The step-cost model is the paper's (arXiv 2607.21535, Sec. 4): one speculative step costs
``t_step = t_verify + t_draft`` and yields ``AL`` tokens on average, so the time per output token
is ``TPOT = t_step / AL``. Windowed-MTP shrinks ``t_draft``; a smaller ``AL`` is the price it may pay.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from .fileio import atomic_path

SCHEMA_VERSION = 1


def tpot(t_verify: float, t_draft: float, mean_accept_length: float) -> float:
    """Time per output token of a speculative step: ``(t_verify + t_draft) / AL``."""
    if mean_accept_length <= 0:
        raise ValueError(f"mean accept length must be positive, got {mean_accept_length}")
    return (t_verify + t_draft) / mean_accept_length


def speedup(old: float, new: float) -> float:
    """Speedup of ``new`` over ``old`` (times): ``old / new - 1``."""
    return old / new - 1


def reduction(old: float, new: float) -> float:
    """Reduction of ``new`` against ``old`` (a cost): ``1 - new / old``."""
    return 1 - new / old


def _version(pkg: str) -> str | None:
    """``pkg``'s installed version, ``None`` when it is not installed; wmtp's own from the package (it
    runs from a checkout too: the GPU machine's copy is not pip-installed)."""
    if pkg == "wmtp":
        from . import __version__

        return __version__
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def command_line(prog: str, argv: list[str]) -> str:
    """The command a metrics JSON records: ``prog`` as typed (``python -m wmtp`` is three words, not
    one argument to quote), then each argument quoted for a POSIX shell."""
    return " ".join([prog, *map(shlex.quote, argv)])


def git_revision(cwd: str | Path | None = None) -> str | None:
    """``HEAD``'s commit hash, with ``-dirty`` when tracked files differ; ``None`` outside git."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if rev.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device | str) -> dict:
    """Versions, machine and device of this run."""
    device = torch.device(device)
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu": cpu(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "versions": {p: _version(p) for p in ("torch", "triton", "datasets", "tokenizers", "numpy", "wmtp")},
        "git_revision": git_revision(Path(__file__).resolve().parent),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
    return env


def cpu() -> dict:
    """The CPU's model name (Linux's /proc/cpuinfo, else ``platform.processor()``) and the instruction
    set torch's CPU kernels use (``AVX2``, ``AVX512``, ...): which kernels run, and so how a float sum
    rounds, depends on it. Two machines with the same code, seed and versions can train different
    models where it differs, so the metrics say which one ran."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {"model": model, "capability": torch.backends.cpu.get_cpu_capability()}


def write_json(path: str | Path, obj: dict) -> Path:
    """Write ``obj`` as indented JSON atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2) + "\n")
    return path
