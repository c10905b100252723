"""Training: losses fall, a trained head drafts tokens that are accepted (and stays lossless),
checkpoints round-trip atomically and refuse another config."""

import dataclasses

import pytest
import torch

import wmtp
from wmtp.config import TrainConfig
from wmtp.train import (
    checkpoint_meta,
    head_accuracy,
    load_checkpoint,
    perplexity,
    save_checkpoint,
    train_head,
    train_target,
)

CFG = TrainConfig(target_steps=60, head_steps=40, batch_size=8, seq_len=64, lr=1e-2, head_lr=1e-2, warmup_steps=5)


def synthetic_tokens(n: int = 20_000, vocab: int = 512, seed: int = 0) -> torch.Tensor:
    """Twenty fixed 12-token phrases in random order: learnable, so drafts can be right."""
    g = torch.Generator().manual_seed(seed)
    phrases = torch.randint(1, vocab, (20, 12), generator=g)
    order = torch.randint(0, 20, (n // 12 + 1,), generator=g)
    return phrases[order].flatten()[:n]


@pytest.fixture(scope="module")
def trained():
    tokens = synthetic_tokens()
    g = torch.Generator().manual_seed(0)
    target, head = wmtp.build_models("tiny", seed=0)
    t_losses = train_target(target, tokens, CFG, g, progress=False)
    h_losses = train_head(head, target, tokens, CFG, g, progress=False)
    return target, head, tokens, t_losses, h_losses


def test_losses_fall(trained):
    _, _, _, t_losses, h_losses = trained
    assert sum(t_losses[-5:]) / 5 < 0.5 * sum(t_losses[:5]) / 5
    assert sum(h_losses[-5:]) / 5 < 0.7 * sum(h_losses[:5]) / 5


def test_head_training_freezes_the_target(trained):
    target, head, tokens, _, _ = trained
    before = {k: v.clone() for k, v in target.state_dict().items()}
    train_head(head, target, tokens, dataclasses.replace(CFG, head_steps=2), torch.Generator().manual_seed(1),
               progress=False)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    assert all(p.requires_grad for p in target.parameters())  # restored afterwards


def test_trained_head_is_accepted_and_lossless(trained):
    target, head, tokens, _, _ = trained
    acc = head_accuracy(head, target, tokens, 2, 64, 4, torch.Generator().manual_seed(0))
    assert acc[0] > 0.3, acc
    t64, h64 = target.double(), head.double()
    try:
        prompt = tokens[100:160]
        ref = wmtp.greedy_generate(t64, prompt, 40)
        for n_sink, window in [(0, None), (4, 16), (0, 2)]:
            out, stats = wmtp.speculative_generate(t64, h64, prompt, 40, 3, n_sink, window)
            assert torch.equal(out, ref)
            assert stats.acceptance_rate > 0.2, (n_sink, window, stats.acceptance_rate)
    finally:
        target.float(), head.float()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: models on the GPU, tokens on the CPU")
def test_evaluation_runs_with_models_on_the_gpu(trained):
    """reproduce moves the models to the device and passes CPU tokens: both evaluations take them."""
    import copy

    target, head, tokens, _, _ = trained
    gpu_target = copy.deepcopy(target).cuda()
    gpu_head = wmtp.MTPHead(head.config, gpu_target)
    gpu_head.load_state_dict(head.state_dict())
    gpu_head.cuda()
    acc = head_accuracy(gpu_head, gpu_target, tokens, 2, 64, 4, torch.Generator().manual_seed(0))
    assert acc == pytest.approx(head_accuracy(head, target, tokens, 2, 64, 4, torch.Generator().manual_seed(0)),
                                abs=0.02)
    assert perplexity(gpu_target, tokens[:2000], 256) == pytest.approx(perplexity(target, tokens[:2000], 256),
                                                                       rel=1e-3)


def test_perplexity_of_a_trained_model_is_low(trained):
    target, _, tokens, _, _ = trained
    assert perplexity(target, tokens[:2000], 256) < 20  # vocabulary is 512: chance is 512
    with pytest.raises(ValueError, match="tokens"):
        perplexity(target, tokens[:10], 256)


def test_checkpoint_round_trip_and_config_check(trained, tmp_path):
    target, head, _, _, _ = trained
    preset = wmtp.get_preset("tiny")
    meta = checkpoint_meta(preset, "synthetic", "abc", 0)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, target, head, meta)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temp file left behind
    t2, h2 = wmtp.build_models("tiny", seed=5)
    load_checkpoint(path, t2, h2, meta)
    assert torch.equal(t2.embed, target.embed) and torch.equal(h2.proj, head.proj)
    other = checkpoint_meta(dataclasses.replace(preset, train=dataclasses.replace(preset.train, lr=1.0)),
                            "synthetic", "abc", 0)
    with pytest.raises(ValueError, match="another config.*train"):
        load_checkpoint(path, t2, h2, other)
    with pytest.raises(ValueError, match="another config.*version"):  # made by other training code
        load_checkpoint(path, t2, h2, {**meta, "version": meta["version"] + 1})
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read: not a file torch.save wrote"):
        load_checkpoint(tmp_path / "junk.pt", t2, h2, meta)
    with pytest.raises(ValueError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt", t2, h2, meta)
    with pytest.raises(ValueError, match="cannot read checkpoint .*: Is a directory"):
        load_checkpoint(tmp_path, t2, h2, meta)


def test_perplexity_scores_the_same_text_in_windows(trained):
    """Two windows of 128 tokens: the mean NLL over both, each window read from its own start."""
    import math

    import torch.nn.functional as F

    target, _, tokens, _, _ = trained
    nll = []
    for w in range(2):
        x = tokens[w * 128 : (w + 1) * 128 + 1][None]
        with torch.no_grad():
            logits, _ = target(x[:, :-1])
        nll.append(F.cross_entropy(logits[0].double(), x[0, 1:], reduction="sum").item())
    assert math.isclose(perplexity(target, tokens, 128, 256), math.exp(sum(nll) / 256), rel_tol=1e-9)


def test_every_perplexity_context_scores_the_same_tokens():
    """reproduce's perplexity reads one text at every context: a multiple of each, below the split."""
    from wmtp.reproduce import perplexity_tokens

    assert perplexity_tokens(10**6, (1024, 4096, 16384)) == 65536  # the small preset's: four longest windows
    assert perplexity_tokens(50_000, (1024, 4096, 16384)) == 49152  # three, where the split is shorter
    assert perplexity_tokens(10_000, (100, 256)) == 6400  # lcm 6400: 64 and 25 windows of the same text
    assert perplexity_tokens(10**6, (64, 256)) == 1024
    with pytest.raises(ValueError, match="needs more than 6400"):
        perplexity_tokens(6400, (100, 256))


def test_random_windows_take_a_text_of_exactly_one_window_and_keep_their_draws():
    from wmtp.train import random_windows

    text = torch.arange(100)
    assert torch.equal(random_windows(text[:10], 3, 10, torch.Generator().manual_seed(0)), text[:10].expand(3, 10))
    with pytest.raises(ValueError, match="has 10 tokens; need at least 11"):
        random_windows(text[:10], 3, 11, torch.Generator().manual_seed(0))
    starts = torch.randint(0, 90, (4,), generator=torch.Generator().manual_seed(3))  # the draws training made
    assert torch.equal(random_windows(text, 4, 10, torch.Generator().manual_seed(3))[:, 0], starts)
