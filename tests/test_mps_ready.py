"""Apple MPS readiness, checked on the CPU: the float32 pipeline never makes a tensor MPS lacks.

DESIGN.md promises every feature on MPS through the reference path, with no float64 on the device
and no sparse tensors. No Apple hardware is at hand, so tests/mps_watch.py plays the device by
provenance (the models, the prompts and whatever is computed from them) and records any float64,
complex128 or sparse tensor there, or any float64 made without saying ``device="cpu"``. One run
covers dense and speculative decoding (native, windowed, ring, paged, re-indexed, gated, adaptive
depth, ``wmtp generate``'s marked run), lockstep and batched rows, sampled decoding (rejection and
Gumbel), and training steps with the evaluations reproduce runs.
"""

from __future__ import annotations

import argparse
import sys

import pytest
import torch
from mps_watch import DeviceDtypeWatch, on_device

import wmtp
from wmtp.bench import bench_draft_attention
from wmtp.cli import build_parser, main
from wmtp.config import KeySetConfig, TrainConfig
from wmtp.generate import generate
from wmtp.train import head_accuracy, perplexity, train_head, train_target

N_SINK, WINDOW, DEPTH, NEW = 4, 12, 3, 6


@pytest.fixture(scope="module")
def models():
    target, head = wmtp.build_models("tiny", seed=0)
    return target.float(), head.float()


def _prompt(length: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (length,), generator=torch.Generator().manual_seed(seed))


def _pipeline(target, head, prompt) -> None:
    """Every float32 decoding path a user on MPS reaches (impl='torch': the reference), outputs checked too."""
    dense = wmtp.greedy_generate(target, prompt, NEW, impl="torch")
    assert on_device(dense)  # the watch follows tensors from the roots
    runs = [dict(depth=DEPTH), dict(depth=wmtp.AdaptiveDepth(DEPTH), draft_cache="ring"),
            dict(depth=DEPTH, positions="reindexed")]
    for kw in runs:
        window = dict(n_sink=N_SINK, window=WINDOW) if len(kw) > 1 else {}
        out, _ = wmtp.speculative_generate(target, head, prompt, NEW, impl="torch", **kw, **window)
        assert torch.equal(out, dense), kw
    run = generate(target, head, prompt, NEW, DEPTH, N_SINK, WINDOW, impl="torch", reference=dense, gate=16)
    assert run.dense_equal  # wmtp generate's run: the drafts marked, a gated key set
    pre = wmtp.prefill_prompt(target, prompt, prompt.numel() + NEW + DEPTH + 1, draft=head, impl="torch", page_size=8)
    out, _ = wmtp.speculative_generate(target, head, prompt, NEW, DEPTH, N_SINK, WINDOW, impl="torch", prefill=pre)
    assert torch.equal(out, dense)

    ragged = [prompt, prompt[:-5]]  # rows of two lengths, each at its own positions
    rows = wmtp.batched_greedy_generate(target, ragged, NEW, impl="torch")
    out, _ = wmtp.batched_speculative_generate(target, head, ragged, NEW, DEPTH, N_SINK, WINDOW, impl="torch")
    assert torch.equal(rows[0], dense) and all(torch.equal(a, b) for a, b in zip(out, rows))
    out, _ = wmtp.lockstep_generate(target, head, torch.stack(ragged[:1] * 2), NEW, DEPTH, N_SINK, WINDOW, impl="torch")
    assert all(torch.equal(a, dense) for a in out)

    sampled = wmtp.sample_generate(target, prompt, NEW, temperature=0.8, seed=1, impl="torch")
    out, _ = wmtp.speculative_sample(target, head, prompt, NEW, DEPTH, N_SINK, WINDOW, temperature=0.8, seed=1,
                                     method="gumbel", impl="torch")
    assert torch.equal(out, sampled)
    wmtp.speculative_sample(target, head, prompt, NEW, DEPTH, N_SINK, WINDOW, temperature=0.8, seed=1,
                            method="rejection", impl="torch", draft_cache="ring")
    keysets = (KeySetConfig(0, None), KeySetConfig(N_SINK, WINDOW))  # bench attention's CPU/MPS timing
    assert len(bench_draft_attention(target.config, (32,), keysets, repeats=1, impl="torch")) == 2


def _training(target, head, text) -> None:
    """A few optimiser steps of both models, then the evaluations reproduce runs."""
    cfg = TrainConfig(target_steps=2, head_steps=2, batch_size=2, seq_len=16, warmup_steps=1)
    g = torch.Generator().manual_seed(0)
    losses = train_target(target, text, cfg, g, progress=False) + train_head(head, target, text, cfg, g, progress=False)
    assert all(map(lambda x: x == x, losses))  # no NaN
    assert perplexity(target, text, 16) > 1
    assert len(head_accuracy(head, target, text, 2, 16, 2, g)) == 2


def test_float32_pipeline_makes_nothing_mps_lacks(models):
    target, head = models
    prompt = _prompt()
    with DeviceDtypeWatch(target, head, prompt) as watch:
        _pipeline(target, head, prompt)
    assert watch.violations == [], "\n".join(watch.violations)


def test_float32_building_and_training_make_nothing_mps_lacks():
    with DeviceDtypeWatch() as watch:  # its own models: training changes the weights
        target, head = (m.float() for m in wmtp.build_models("tiny", seed=0))
    text = _prompt(120, seed=3)  # host tokens, as a corpus
    with DeviceDtypeWatch(target, head) as watch_training:
        _training(target, head, text)
    watch.violations += watch_training.violations
    assert watch.violations == [], "\n".join(watch.violations)


def test_the_watch_catches_float64_on_the_device(models, monkeypatch):
    """The check can fail: a ``.double()`` in the reference attention, a float64 factory on a tensor's
    device, a float64 host tensor moved to the device, a sparse tensor and a generator's draw that does
    not name its device are each recorded;
    host-side float64 that says so (``device="cpu"``, ``.cpu()``) is not."""
    target, head = models
    prompt = _prompt()
    package = sys.modules["wmtp.attention"]  # the name attention() calls
    reference = package.attention_torch

    def doubled(q, *args, **kw):  # the reference attention with a .double() in it
        return reference(q.double(), *args, **kw).to(q.dtype)

    monkeypatch.setattr(package, "attention_torch", doubled)
    with DeviceDtypeWatch(target, head, prompt) as watch:
        wmtp.greedy_generate(target, prompt, 2, impl="torch")
    assert watch.violations and all("float64 on the device" in v for v in watch.violations), watch.violations
    assert any("test_mps_ready.py" in v and "q.double()" in v for v in watch.violations), watch.violations
    monkeypatch.undo()

    cases = {
        "factory": lambda x: torch.zeros(3, dtype=torch.float64, device=x.device),
        "default device": lambda x: torch.zeros(3, dtype=torch.float64),
        "moved": lambda x: torch.zeros(3, dtype=torch.float64, device="cpu").to(x.device),
        "promoted": lambda x: x + torch.zeros(1, dtype=torch.float64, device="cpu"),
        "sparse": lambda x: x.to_sparse(),
        "generator": lambda x: torch.randn(3, generator=torch.Generator()),  # lands on the default device
    }
    for name, make in cases.items():
        with DeviceDtypeWatch(target) as watch:
            make(target.embed[:2])
        assert len(watch.violations) == 1, (name, watch.violations)
    with DeviceDtypeWatch(target) as watch:  # host-side float64, said so in code
        x = target.embed[:2]
        u = torch.rand(4, dtype=torch.float64, device="cpu", generator=torch.Generator().manual_seed(0))
        assert on_device(x[:, :4] + (-torch.log(u)).to(x.device, x.dtype)) and not on_device(u)
        x.cpu().double().sum()
        x.to("cpu").double().sum()
        assert on_device(x)
    assert watch.violations == [], watch.violations


def _commands_with_device(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every subcommand of the ``wmtp`` parser that takes ``--device``, as argv prefixes."""
    found = [prefix] if any("--device" in a.option_strings for a in parser._actions) else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands_with_device(sub, (*prefix, name))
    return found


DEVICE_COMMANDS = _commands_with_device(build_parser())


def test_every_device_option_is_covered():
    assert {c[0] for c in DEVICE_COMMANDS} == {"reproduce", "generate", "bench"}
    assert len([c for c in DEVICE_COMMANDS if c[0] == "bench"]) == 6  # attention and the five on reproduce's models


@pytest.mark.parametrize("command", DEVICE_COMMANDS, ids=" ".join)
def test_device_mps_absent_is_one_line_before_any_work(command, capsys, tmp_path, monkeypatch):
    """``--device mps`` where MPS is absent (this machine; patched, so a Mac runs it too) exits 2 with
    one line, before any file is written."""
    monkeypatch.setattr("wmtp.device.mps_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    code = main([*command, "--device", "mps", "--preset", "tiny"])
    out, err = capsys.readouterr()
    assert code == 2 and err == (f"wmtp {' '.join(command)}: error: device 'mps' requested but Apple MPS is not "
                                 "available on this machine\n"), err
    assert out == "" and list(tmp_path.iterdir()) == []


def test_mps_picks_float32_and_the_reference(monkeypatch, tmp_path):
    """With MPS present (patched), ``wmtp generate`` decodes in float32 with the reference attention,
    and refuses what MPS cannot run (Triton, CUDA graphs) with a ValueError before any work."""
    from wmtp.generate_cli import _options

    monkeypatch.setattr("wmtp.device.mps_available", lambda: True)
    argv = ["generate", "--device", "mps", "--preset", "tiny", "--cache-dir", str(tmp_path / "cache")]
    _, device, dtype, impl, _, _ = _options(build_parser().parse_args(argv))
    assert (device, dtype, impl) == (torch.device("mps"), torch.float32, "torch")
    for extra, match in ((["--impl", "triton"], "needs a CUDA device"), (["--loop", "graph"], "CUDA graphs")):
        with pytest.raises(ValueError, match=match):
            _options(build_parser().parse_args(argv + extra))
