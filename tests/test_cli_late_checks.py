"""Bad input the command line can only see once a run has begun (the corpus's size, a cache that
cannot take the checkpoint, a size the machine cannot hold): still one line, exit 2, and caught
before the long work (training) where it can be. Also what a reproduction takes from its corpus and
seed (its prompts, its loss curves' last losses, its untrained models), on a stubbed corpus with the
slow parts stubbed out."""

import dataclasses
import os
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from wmtp.cli import main
from wmtp.config import get_preset


@pytest.mark.needs_datasets  # its folder is read through `datasets`, as wikitext_dir's
def test_a_short_test_split_is_refused_before_the_training(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("wmtp.reproduce.prepare_models", lambda *a, **k: pytest.fail("the training started"))
    rng, words = random.Random(0), "the of and in to a was is for on as with by he at from".split()
    for split, n in (("train", 3000), ("valid", 3000), ("test", 40)):  # tiny's contexts: 64 and 256 tokens
        (tmp_path / f"{split}.txt").write_text(" ".join(rng.choice(words) for _ in range(n)) + "\n")
    code = main(["reproduce", "--preset", "tiny", "--dataset-dir", str(tmp_path), "--device", "cpu", "--no-progress",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert code == 2 and "wmtp reproduce: error: the test split has" in err and "context 256 needs more" in err, err
    assert not (tmp_path / "m.json").exists()


def _stub_corpus(splits: dict, monkeypatch) -> None:
    """A corpus whose token splits are ``splits``: loading, the tokenizer and its output stubbed (no
    dataset dir, so no `datasets` package needed)."""
    corpus = SimpleNamespace(name="c", source="stub", message="a stub corpus", fingerprint="0")
    monkeypatch.setattr("wmtp.reproduce.data.load_corpus", lambda *a, **k: corpus)
    monkeypatch.setattr("wmtp.reproduce.tokenizer.train_tokenizer", lambda *a: None)
    monkeypatch.setattr("wmtp.reproduce.tokenizer.corpus_token_splits", lambda corpus, tok: splits)


@pytest.mark.parametrize("n_test, message", [(255, "the test split has 255 tokens"), (256, "the training started")])
def test_a_test_split_as_long_as_the_longest_context_is_enough(capsys, tmp_path, monkeypatch, n_test, message):
    """tiny's longest context is 256 tokens, its prompt the test split's first 256: a split of 256 tokens
    gets past the check (to the training, stubbed to fail), one of 255 does not (mutation round 5:
    refusing 256 as well survived)."""
    def started(*a, **k):
        raise ValueError("the training started")

    monkeypatch.setattr("wmtp.reproduce.prepare_models", started)
    splits = {"train": torch.zeros(3000, dtype=torch.long), "valid": torch.zeros(3000, dtype=torch.long),
              "test": torch.zeros(n_test, dtype=torch.long)}
    _stub_corpus(splits, monkeypatch)
    code = main(["reproduce", "--preset", "tiny", "--device", "cpu", "--no-progress", "--cache-dir",
                 str(tmp_path / "cache"), "--out", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


def test_the_prompts_and_training_losses_a_reproduction_records(tmp_path, monkeypatch):
    """A test split of ids 0, 1, 2, ...: the prompts at tiny's contexts 64 and 256 are 0..63 and 0..255;
    of the training's loss curves the metrics keep the last loss (untrained models, scripted losses,
    evaluations, arms and attention timing stubbed; mutation round 5: prompts from the second token
    on, and the first loss for the last, survived)."""
    import wmtp
    from wmtp import reproduce

    target, head = wmtp.build_models("tiny", seed=0)
    info = {"loaded": False, "target_losses": [6.0, 5.0, 4.5], "head_losses": [7.0, 6.5]}
    prompts = []
    monkeypatch.setattr(reproduce, "prepare_models", lambda *a, **k: (target, head, info))
    monkeypatch.setattr(reproduce, "perplexity", lambda *a: 0.0)
    monkeypatch.setattr(reproduce, "head_accuracy", lambda *a: [])
    monkeypatch.setattr(reproduce, "run_arms", lambda target, head, prompt, preset: prompts.append(prompt.tolist()))
    monkeypatch.setattr(reproduce, "bench_draft_attention", lambda *a, **k: [])
    splits = {"train": torch.zeros(3000, dtype=torch.long), "valid": torch.zeros(3000, dtype=torch.long),
              "test": torch.arange(300)}
    _stub_corpus(splits, monkeypatch)
    m = reproduce.reproduce(get_preset("tiny"), None, torch.device("cpu"), 0, None, tmp_path / "cache", None,
                            "wmtp reproduce", progress=False, log=lambda *a: None)
    assert prompts == [list(range(64)), list(range(256))]
    assert m["training"] == {"loaded": False, "target_losses": 4.5, "head_losses": 6.5}


def test_the_metrics_name_the_weights_trained_or_loaded(tmp_path, monkeypatch):
    """``weights_sha256`` reaches reproduce's metrics JSON and the benches' header: one digest whether a
    run trains the checkpoint or loads it into fresh models, and when another cache trains it again from
    the seed (CPU training is deterministic); the digest of the weights saved, not of the untrained models.
    On a stubbed corpus, evaluations, arms and attention timing stubbed; 2 + 2 training steps (tiny's
    30 + 20 took 17-24 s a training on 2 shared cores)."""
    import dataclasses
    import json

    import wmtp
    from wmtp import bench_common, reproduce
    from wmtp.train import weights_sha256

    for name, stub in (("perplexity", lambda *a: 0.0), ("head_accuracy", lambda *a: []),
                       ("run_arms", lambda *a: {}), ("bench_draft_attention", lambda *a, **k: [])):
        monkeypatch.setattr(reproduce, name, stub)
    g = torch.Generator().manual_seed(0)
    _stub_corpus({k: torch.randint(0, 512, (3000,), generator=g) for k in ("train", "valid", "test")}, monkeypatch)
    p = get_preset("tiny")
    preset = dataclasses.replace(p, train=dataclasses.replace(p.train, target_steps=2, head_steps=2))

    def run(cache: str, out: str) -> dict:
        reproduce.reproduce(preset, None, torch.device("cpu"), 0, tmp_path / out, tmp_path / cache, None,
                            "wmtp reproduce", progress=False, log=lambda *a: None)
        return json.loads((tmp_path / out).read_text())["training"]

    first, again, other = run("a", "1.json"), run("a", "2.json"), run("b", "3.json")
    assert (first["loaded"], again["loaded"], other["loaded"]) == (False, True, False)
    assert first["weights_sha256"] == again["weights_sha256"] == other["weights_sha256"]
    target, head = wmtp.build_models("tiny", seed=0)
    untrained = weights_sha256(target, head)
    blob = torch.load(first["checkpoint"], weights_only=True)
    target.load_state_dict(blob["target"]), head.load_state_dict(blob["head"])
    assert weights_sha256(target, head) == first["weights_sha256"] != untrained
    header = bench_common.bench_setup("bench-x", preset, None, torch.device("cpu"), 0, (64,), tmp_path / "a",
                                      "wmtp bench x", False, lambda *a: None).header
    assert header["checkpoint"]["loaded"] and header["checkpoint"]["weights_sha256"] == first["weights_sha256"]


def test_a_checkpoint_that_cannot_be_written_fails_before_the_training(tmp_path, monkeypatch):
    from wmtp import reproduce

    monkeypatch.setattr(reproduce, "train_target", lambda *a, **k: pytest.fail("the training started"))
    (tmp_path / "f").write_text("x")
    corpus = SimpleNamespace(name="c", fingerprint="0")
    with pytest.raises(ValueError, match="checkpoint .*f/ckpt.pt cannot be written"):
        reproduce.prepare_models(get_preset("tiny"), corpus, {}, 0, "cpu", tmp_path, tmp_path / "f" / "ckpt.pt",
                                 False, print)


def test_both_models_start_from_the_seed(tmp_path, monkeypatch):
    """Untrained (training stubbed), prepare_models' models are those one generator seeded with the
    seed draws, the target then the head: seeds 0 and 1 give other heads (mutation round 5: the head
    drawn from its own default generator, the same for every seed, survived)."""
    from wmtp import reproduce
    from wmtp.model import TargetLM
    from wmtp.mtp import MTPHead

    trained = []  # what each training was given: its tokens and its generator's seed (the batches')
    monkeypatch.setattr(reproduce, "train_target", lambda m, tokens, cfg, g, progress: trained.append(
        ("target", tokens, g.initial_seed())) or [])
    monkeypatch.setattr(reproduce, "train_head", lambda m, t, tokens, cfg, g, progress: trained.append(
        ("head", tokens, g.initial_seed())) or [])
    preset, heads, names = get_preset("tiny"), [], []
    for seed in (0, 1):
        corpus = SimpleNamespace(name="c", fingerprint=str(seed))
        trained.clear()
        target, head, info = reproduce.prepare_models(preset, corpus, {"train": "TRAIN"}, seed, "cpu", tmp_path, None,
                                                      False, lambda *a: None)
        # the batches are drawn from the seed too (a fresh default generator for either survived, session 54)
        assert trained == [("target", "TRAIN", seed), ("head", "TRAIN", seed)]
        names.append(Path(info["checkpoint"]).name)
        g = torch.Generator().manual_seed(seed)
        want_target = TargetLM(preset.model, generator=g)
        want_head = MTPHead(preset.mtp, want_target, generator=g)
        for got, want in ((target, want_target), (head, want_head)):
            assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), want.state_dict().values()))
        heads.append(head.state_dict())
    assert not all(torch.equal(a, b) for a, b in zip(heads[0].values(), heads[1].values()))
    # the default checkpoint's name carries a hash of the configs and the corpus: another config, another file
    # (without it, a changed config found the old file and was refused)
    other = dataclasses.replace(preset, train=dataclasses.replace(preset.train, head_steps=preset.train.head_steps + 1))
    corpus = SimpleNamespace(name="c", fingerprint="1")
    _, _, info = reproduce.prepare_models(other, corpus, {"train": "TRAIN"}, 1, "cpu", tmp_path, None, False,
                                          lambda *a: None)
    renamed = Path(info["checkpoint"]).name
    assert re.fullmatch(r"ckpt-tiny-c-seed1-[0-9a-f]{12}\.pt", names[1]) and renamed != names[1]
    assert renamed.startswith("ckpt-tiny-c-seed1-") and names[0].startswith("ckpt-tiny-c-seed0-")


@pytest.mark.parametrize("error", [RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you "
                                                "tried to allocate 10 bytes\nmore"), MemoryError(),
                                   RuntimeError("Out of memory"),  # any case (mutation round 8: .lower() dropped)
                                   torch.OutOfMemoryError("tried to allocate 20.00 GiB")])  # by its type alone
def test_an_allocation_that_fails_is_one_line(capsys, monkeypatch, error):
    def run(*args):
        raise error

    monkeypatch.setattr("wmtp.bench.attention_cli", run)
    assert main(["bench", "attention", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wmtp bench attention: error: out of memory (") and "ask for less" in err
    assert len(err.splitlines()) == 1


def test_an_os_error_is_one_line(capsys, monkeypatch):
    """A file the run cannot read or write (a full disk, say): one line and exit 2, no traceback
    (mutation round 8: main catching ValueError alone survived)."""
    def run(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("wmtp.bench.attention_cli", run)
    assert main(["bench", "attention", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == "wmtp bench attention: error: [Errno 28] No space left on device\n"


def test_another_runtime_error_is_not_hidden(monkeypatch):
    def run(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr("wmtp.bench.attention_cli", run)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["bench", "attention", "--device", "cpu"])


def test_bench_depth_default_depths_fit_the_preset(capsys, monkeypatch):
    seen = []

    def check_options(depths, max_depth, *rest):
        seen.append((depths, max_depth))
        raise ValueError("stop here")

    monkeypatch.setattr("wmtp.bench_depth.check_options", check_options)
    for preset, depths in (("tiny", (1, 3)), ("small", (1, 3, 7))):
        assert main(["bench", "depth", "--preset", preset, "--device", "cpu"]) == 2
        assert seen.pop() == (depths, get_preset(preset).spec.depth)
    assert "stop here" in capsys.readouterr().err


def test_a_checkpoint_that_is_a_fifo_is_refused_not_read(tmp_path):
    from wmtp.train import load_checkpoint

    os.mkfifo(tmp_path / "fifo.pt")  # torch.load would wait for a writer forever
    with pytest.raises(ValueError, match="checkpoint .*fifo.pt is not a regular file"):
        load_checkpoint(tmp_path / "fifo.pt", None, None, {})
