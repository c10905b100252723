"""Frozen configuration dataclasses and the named presets.

Every experiment is described by these dataclasses; ``dataclasses.asdict`` of each goes verbatim
into the metrics JSON (wmtp/metrics.py). Paper symbols (arXiv 2607.21535, Sec. 3-4) are named in
the field comments. Presets live in one dict, ``PRESETS``: ``tiny`` for tests (seconds on CPU),
``small`` for the CPU reproduction (``wmtp reproduce``, 7-10 minutes on two cores: 390 s and 605 s
measured on two machines).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .checks import check_int, check_number
from .keyset import LIMIT, check_key_set_args
from .policy import check_gate


def _tuple_field(config, name: str):
    """The field ``name`` of ``config``, a list given for it read as the tuple: one rule for every tuple
    field (a frozen config stays hashable; ``asdict`` writes either as a JSON list)."""
    value = getattr(config, name)
    if isinstance(value, list):
        object.__setattr__(config, name, tuple(value))
    return getattr(config, name)


def _check_ints(name: str, values, low: int) -> None:
    """``values`` must be a non-empty tuple of ints ``>= low``."""
    if not isinstance(values, tuple) or not values:
        raise ValueError(f"{name} must be a non-empty tuple of integers >= {low}, got {values!r}")
    for v in values:
        check_int(f"each of {name}", v, low)


@dataclass(frozen=True)
class ModelConfig:
    """Target LM: Llama-style decoder with local (RoPE, sliding window) and global (NoPE) layers."""

    vocab_size: int = 4096
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4  # query heads Hq
    n_kv_heads: int = 2  # key/value heads Hkv (GQA: Hq % Hkv == 0)
    d_ff: int = 384  # SwiGLU hidden size
    local_window: int = 64  # keys a local layer reads (same formula as the draft, n_sink=0)
    global_layers: tuple[int, ...] = (1, 3)  # full-attention NoPE layers; the rest are local
    rope_theta: float = 10000.0
    train_seq_len: int = 256  # context used in training; NoPE layers scale q by log-length past it
    max_seq_len: int = 20480  # KV-cache capacity in positions
    norm_eps: float = 1e-5
    head_dim: int = field(init=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            check_int(name, getattr(self, name), 1)
        check_int("train_seq_len", self.train_seq_len, 2)  # global layers scale q by log(t + 1) / log(train_seq_len)
        check_number("rope_theta", self.rope_theta, positive=True)
        check_number("norm_eps", self.norm_eps, positive=False)
        if not isinstance(_tuple_field(self, "global_layers"), tuple) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in self.global_layers):
            raise ValueError(f"global_layers must be a tuple of layer indices (ints), got {self.global_layers!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if any(not 0 <= i < self.n_layers for i in self.global_layers):
            raise ValueError(f"global_layers {self.global_layers} out of range for {self.n_layers} layers")
        check_key_set_args(0, self.local_window)
        object.__setattr__(self, "head_dim", self.d_model // self.n_heads)


@dataclass(frozen=True)
class MTPConfig:
    """DeepSeek-V3-style MTP draft head: one transformer block with its own (draft) KV cache."""

    train_depth: int = 3  # recursive steps unrolled in training (draft positions 1..train_depth)
    rope: bool = True  # draft keys carry RoPE of their absolute position (paper default)

    def __post_init__(self) -> None:
        check_int("train_depth", self.train_depth, 1)
        if not isinstance(self.rope, bool):
            raise ValueError(f"rope must be True or False, got {self.rope!r}")


@dataclass(frozen=True)
class KeySetConfig:
    """One draft key set: ``n_sink`` sinks plus ``window`` recent keys (``None`` = full context),
    read by the steps past a context of ``gate`` tokens only (``gated_key_set`` in wmtp/policy.py;
    ``None``: at every context, as in the paper)."""

    n_sink: int = 64  # paper: 64 attention sinks
    window: int | None = 4096  # paper: 4096 recent keys, including the query's own
    gate: int | None = None  # beyond the paper: the full causal set up to this context

    def __post_init__(self) -> None:  # n_sink None reads as 0, as everywhere (label and JSON say 0)
        object.__setattr__(self, "n_sink", check_key_set_args(self.n_sink, self.window))
        check_gate(self.gate, self.window)

    @property
    def label(self) -> str:
        if self.window is None:
            return "native"
        return f"sink{self.n_sink}+win{self.window}" + ("" if self.gate is None else f"+gate{self.gate}")


def parse_keyset(text: str, flag: str = "--keysets") -> KeySetConfig:
    """``"SINK:WINDOW"`` or ``"SINK:WINDOW@GATE"`` (the command line's forms, e.g. ``64:4096`` and
    ``8:64@8192``) to a ``KeySetConfig``; ``ValueError`` on anything else, a number out of range as
    ``flag text: ...`` in the command line's terms (KeySetConfig's own words name ``None``)."""
    match = re.fullmatch(r"(-?[0-9]+):(-?[0-9]+)(?:@(-?[0-9]+))?", text)
    if match is None:  # int() alone would take " 8:64" and "1_0:64"
        raise ValueError(f"key set {text!r} is not SINK:WINDOW or SINK:WINDOW@GATE (integers, e.g. 64:4096 "
                         "or 8:64@8192)")
    sink, window, gate = (None if g is None else int(g) for g in match.groups())
    for what, value, ok, bounds in (("sink count", sink, 0 <= sink <= LIMIT, "from 0 to 2**62"),
                                    ("window", window, 1 <= window <= LIMIT, "from 1 to 2**62"),
                                    ("gate", gate, gate is None or gate >= 1, ">= 1 (a context length)")):
        if not ok:
            raise ValueError(f"{flag} {text}: the {what} must be an integer {bounds}, got {value}")
    return KeySetConfig(n_sink=sink, window=window, gate=gate)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation of the target LM and, separately, of the MTP head (target frozen)."""

    target_steps: int = 200
    head_steps: int = 100
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    head_lr: float = 3e-3
    weight_decay: float = 0.1
    warmup_steps: int = 20
    grad_clip: float = 1.0
    max_train_chars: int | None = 4_000_000  # cap on training text (tokenizer and LM)

    def __post_init__(self) -> None:
        for name, low in (("target_steps", 0), ("head_steps", 0), ("batch_size", 1), ("seq_len", 1),
                          ("warmup_steps", 0)):
            check_int(name, getattr(self, name), low)
        for name in ("lr", "head_lr"):
            check_number(name, getattr(self, name), positive=True)
        check_number("weight_decay", self.weight_decay, positive=False)
        check_number("grad_clip", self.grad_clip, positive=True, finite=False)  # inf: no clipping
        if self.max_train_chars is not None:
            check_int("max_train_chars", self.max_train_chars, 1)


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding experiment: draft depth, arms, contexts and repeats."""

    depth: int = 7  # paper: 7 draft tokens per step (MTP depth K)
    keysets: tuple[KeySetConfig, ...] = (
        KeySetConfig(n_sink=0, window=None),  # native: the draft reads the whole context
        KeySetConfig(n_sink=64, window=4096),  # paper setting
        KeySetConfig(n_sink=8, window=64),  # small setting
    )
    contexts: tuple[int, ...] = (1024, 4096, 16384)
    new_tokens: int = 64
    repeats: int = 3  # timing repeats (medians reported)
    ppl_contexts: tuple[int, ...] = (1024, 4096, 16384)

    def __post_init__(self) -> None:
        check_int("depth", self.depth, 1)
        if not isinstance(_tuple_field(self, "keysets"), tuple) or not self.keysets or not all(
                isinstance(k, KeySetConfig) for k in self.keysets):
            raise ValueError(f"keysets must be a non-empty tuple of KeySetConfig, got {self.keysets!r}")
        _check_ints("contexts", _tuple_field(self, "contexts"), 1)
        _check_ints("ppl_contexts", _tuple_field(self, "ppl_contexts"), 1)
        check_int("new_tokens", self.new_tokens, 1)
        check_int("repeats", self.repeats, 1)
        for what, items in (("key set", [k.label for k in self.keysets]), ("context", self.contexts)):
            twice = [x for i, x in enumerate(items) if x in items[:i]]
            if twice:  # an arm or a context run twice would overwrite its own metrics
                raise ValueError(f"{what} {twice[0]} is given twice")


@dataclass(frozen=True)
class Preset:
    name: str
    model: ModelConfig
    mtp: MTPConfig
    train: TrainConfig
    spec: SpecConfig


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        name="tiny",
        model=ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                          local_window=16, global_layers=(1,), train_seq_len=64, max_seq_len=2048),
        mtp=MTPConfig(train_depth=2),
        train=TrainConfig(target_steps=30, head_steps=20, batch_size=8, seq_len=64, max_train_chars=200_000),
        spec=SpecConfig(depth=3, keysets=(KeySetConfig(0, None), KeySetConfig(4, 16)), contexts=(64, 256),
                        new_tokens=16, repeats=2, ppl_contexts=(64, 256)),
    ),
    "small": Preset(
        name="small",
        model=ModelConfig(d_model=256, n_heads=4, n_kv_heads=4, d_ff=512),
        mtp=MTPConfig(train_depth=2),
        train=TrainConfig(target_steps=300, head_steps=150),
        spec=SpecConfig(new_tokens=128),
    ),
}


def get_preset(name: str) -> Preset:
    """Look up a preset by name; raises ``ValueError`` naming the known presets."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[name]
