"""``DeviceDtypeWatch``: what would break on Apple MPS, seen on the CPU (tests/test_mps_ready.py).

MPS has no float64 (nor complex128) and no sparse tensors: a tensor of those made on the device
raises there. Nobody here has MPS hardware, so the float32 pipeline runs on the CPU under this
watch, which plays "the device" by provenance, since on the CPU a device tensor and a host tensor
look alike:

- a tensor is *on the device* when it is a root the test names (the models' parameters and
  buffers, the prompts), comes from a factory call that names a ``device`` other than the literal
  string ``"cpu"`` (``device=x.device``, ``device=dev``: on MPS that is the device), comes from a
  ``.to(...)`` that names such a device, or is the output of an op with an input on the device;
- ``.cpu()``, ``.to("cpu")`` and ``.to(device="cpu")`` bring a tensor back to the host.

It records (``violations``) every float64 or complex128 tensor *on the device*, every such tensor a
factory makes without saying ``device="cpu"`` (under ``torch.set_default_device("mps")`` it would
land on the device), every one an op makes inside torch with no input at all (a hidden factory),
every sparse tensor, and every draw from a ``torch.Generator`` that does not name its ``device``
(under ``torch.set_default_device("mps")`` a CPU generator's draw would be made on MPS, which
raises). Host-side float64 helpers (``sampling.position_uniforms``' noise, the
float64 cross-entropy of ``train.perplexity`` after ``.cpu()``) pass because they say so in code,
not because an allow-list names them.

A ``TorchFunctionMode`` sees the Python-level calls (factories and their ``device=``, ``.to``,
``.cpu``); a ``TorchDispatchMode`` under it sees every aten op's inputs and outputs, backward and
optimizer steps included.
"""

from __future__ import annotations

import os
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode

import wmtp

MPS_LACKS = (torch.float64, torch.complex128)
_FACTORIES = _device_constructors()
_TAG = "_wmtp_on_device"  # attribute set on a tensor on the (pretend) device
_TO_HOST = {torch.Tensor.cpu}


def on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _TAG, False)


def _mark(t: torch.Tensor, value: bool = True) -> None:
    try:
        setattr(t, _TAG, value)
    except (AttributeError, RuntimeError):  # a tensor type without a __dict__: leave it
        pass


def _tensors(tree) -> list[torch.Tensor]:
    """The tensors in ``tree`` (nested lists, tuples and dicts; cheaper than pytree's flatten)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for x in tree for t in _tensors(x)]
    if isinstance(tree, dict):
        return [t for x in tree.values() for t in _tensors(x)]
    return []


_PACKAGE = os.path.dirname(os.path.abspath(wmtp.__file__)) + os.sep  # the library's own files
_TESTS = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _where() -> str:
    """The innermost frame of wmtp (or of a test) that made the call: file:line and the line. Matched by
    folder, not by name: a checkout is itself often called ``wmtp``, and its ``.venv`` holds torch."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = os.path.abspath(frame.filename)
        if path.startswith(_PACKAGE) or (path.startswith(_TESTS) and os.path.basename(path).startswith("test_")):
            return f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}:{frame.lineno}: {frame.line}"
    return "(inside torch)"


def _names_host(device) -> bool:
    return device == "cpu"  # the literal string: code that says the tensor lives on the host


def _to_device_arg(args, kwargs):
    """The device a ``Tensor.to`` call names, or ``None`` (a dtype alone, or another tensor's)."""
    if "device" in kwargs:
        return kwargs["device"]
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            return a
        if isinstance(a, torch.Tensor):  # .to(other): other's device
            return a.device if on_device(a) else None
    return None


class _Calls(TorchFunctionMode):
    def __init__(self, watch: DeviceDtypeWatch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES:
            self.watch.factory_depth += 1
            try:
                out = func(*args, **kwargs)
            finally:
                self.watch.factory_depth -= 1
            device, generator = kwargs.get("device"), kwargs.get("generator")
            if generator is not None and device is None:
                self.watch.record(f"torch.{func.__name__} draws from a {generator.device.type} generator without "
                                  "naming device= (torch.set_default_device('mps') would put it on MPS: raises)")
            for t in _tensors(out):
                if device is not None and not _names_host(device):
                    _mark(t)
                if t.dtype in MPS_LACKS and not _names_host(device):
                    self.watch.record(f"torch.{func.__name__} makes {t.dtype} without device='cpu'")
            return out
        out = func(*args, **kwargs)
        src = args[0] if args else None
        if isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor):
            if func in _TO_HOST or (func is torch.Tensor.to and _names_host(_to_device_arg(args, kwargs))):
                out = out.view_as(out) if out is src else out  # a fresh tensor: src stays where it was
                _mark(out, False)
            elif func is torch.Tensor.to and _to_device_arg(args, kwargs) is not None:
                out = out.view_as(out) if out is src and not on_device(src) else out
                _mark(out)
                if out.dtype in MPS_LACKS:
                    self.watch.record(f"Tensor.to moves {out.dtype} to the device")
        return out


class _Ops(TorchDispatchMode):
    def __init__(self, watch: DeviceDtypeWatch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = _tensors((args, kwargs))
        device = any(on_device(t) for t in inputs)
        for t in _tensors(out):
            if t.layout != torch.strided:
                self.watch.record(f"{func} makes a {t.layout} tensor")
            if device:
                _mark(t)
                if t.dtype in MPS_LACKS:
                    self.watch.record(f"{func} makes {t.dtype} on the device")
            elif not inputs and t.dtype in MPS_LACKS and not self.watch.factory_depth:
                self.watch.record(f"{func} makes {t.dtype} (a factory inside torch)")
        return out


class DeviceDtypeWatch:
    """``with DeviceDtypeWatch(*roots) as w: ...``, then ``w.violations``: ``"where: what"`` lines.

    ``roots``: tensors and modules on the (pretend) device: their parameters and buffers, the prompts."""

    def __init__(self, *roots) -> None:
        self.violations: list[str] = []
        self.factory_depth = 0
        for r in roots:
            for t in (list(r.parameters()) + list(r.buffers())) if isinstance(r, torch.nn.Module) else _tensors(r):
                _mark(t)
        self._modes = (_Calls(self), _Ops(self))

    def record(self, what: str) -> None:
        line = f"{_where()}  [{what}]"
        if line not in self.violations:
            self.violations.append(line)

    def __enter__(self) -> DeviceDtypeWatch:
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for m in reversed(self._modes):
            m.__exit__(*exc)
