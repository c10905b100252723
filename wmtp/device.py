"""Devices, picked in one place: ``resolve_device`` maps a name to a ``torch.device`` or raises.

The plain-PyTorch reference path (wmtp/attention/reference.py) runs on CPU, Apple MPS and CUDA;
``auto`` prefers CUDA, then MPS, then CPU. Asking for a device that is absent is an error, never a
silent fallback. ``capture_graph`` captures a CUDA call in a graph (wmtp/static_decode.py's steps,
the bench's timings). Library plumbing, beyond the paper (arXiv 2607.21535).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

DEVICES = ("auto", "cpu", "mps", "cuda")


def resolve_device(name: str) -> torch.device:
    """``"auto" | "cpu" | "mps" | "cuda"`` (or ``"cuda:N"``) to a ``torch.device``.

    Raises:
        ValueError: for an unknown name or a device this machine does not have.
    """
    base = name.split(":")[0]
    if base not in DEVICES:
        raise ValueError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")
    if base in ("auto", "cpu") and name != base:  # torch would ignore cpu's index; auto has none
        raise ValueError(f"bad device {name!r}: only cuda and mps take an index (cuda:1)")
    if base == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if mps_available() else torch.device("cpu")
    if base == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available on this machine")
    if base == "mps" and not mps_available():
        raise ValueError(f"device {name!r} requested but Apple MPS is not available on this machine")
    try:
        return torch.device(name)
    except RuntimeError as e:  # "cuda:abc": torch's own message, as a ValueError
        raise ValueError(f"bad device {name!r}: {e}") from None


def check_dtype(device: torch.device, dtype: torch.dtype) -> None:
    """Raise ``ValueError`` for a dtype the device lacks: Apple MPS has no float64."""
    if torch.device(device).type == "mps" and dtype == torch.float64:
        raise ValueError("Apple MPS has no float64; use float32")


def mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def capture_graph(fn: Callable[[], object], pool=None) -> torch.cuda.CUDAGraph:
    """``fn`` run once on a side stream (compiles, allocator warm-up), then captured in a CUDA graph
    whose allocations come from memory pool ``pool`` (``torch.cuda.graph_pool_handle()``; ``None``:
    a pool of its own)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as capture requires
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    caller = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, pool=pool):
            fn()
    except Exception:
        _recover_from_failed_capture(caller)
        raise  # the capture's own error: what failed
    return graph


def _recover_from_failed_capture(caller: torch.cuda.Stream) -> None:
    """NOTE [Failed capture]: when a capture fails (a host sync inside it, say), torch's
    ``torch.cuda.graph`` raises from ``capture_end`` before it restores the caller's stream, and
    ``capture_end`` raises before the epilogue that marks the device's default CUDA generator as no
    longer capturing (the stream: read in torch 2.13's torch/cuda/graphs.py; the generator: seen on
    torch 2.11, GPU test run DK): the caller would go on in the capture's side stream, and every later
    random op on the device would raise "Offset increment outside graph capture encountered
    unexpectedly". So: the caller's stream made current again, then one capture that succeeds (a graph
    of one tiny op, dropped), which runs the epilogue. Should that fail too, the capture's own error
    is the one raised."""
    torch.cuda.set_stream(caller)
    try:
        x = torch.zeros(1, device="cuda")  # the current device's, as the failed capture's was
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            x.add_(1)
    except Exception:
        pass


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU), so wall-clock timings are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
