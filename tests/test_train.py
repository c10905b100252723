"""Training: losses fall, a trained head drafts tokens that are accepted (and stays lossless),
checkpoints round-trip atomically and refuse another config."""

import dataclasses
import hashlib
import math

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
    weights_sha256,
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
    with pytest.raises(ValueError, match="context must be an integer >= 1, got 0"):  # a ZeroDivisionError before
        perplexity(target, tokens[:2000], 0)
    with pytest.raises(ValueError, match="context must be an integer >= 1, got -5"):  # returned 0.0 before
        perplexity(target, tokens[:2000], -5)
    with pytest.raises(ValueError, match="n_tokens must be an integer >= 1, got 256.0"):
        perplexity(target, tokens[:2000], 128, 256.0)
    with pytest.raises(ValueError, match="tokens must be a torch.Tensor, got list"):
        perplexity(target, tokens[:2000].tolist(), 128)



def test_perplexity_is_the_mean_of_each_window_s_losses_over_one_token_more():
    """Two windows of 32 over 64 tokens: each window reads 33 tokens (its 32 and the next, to score its
    last), the per-token losses summed over both and divided by 64. A text of exactly 64 tokens has no
    token after the second window: refused."""
    from torch.nn.functional import cross_entropy

    target, _ = wmtp.build_models("tiny", seed=0)
    tokens = torch.arange(65) * 7 % target.config.vocab_size
    nll = 0.0
    with torch.no_grad():
        for w in (tokens[:33], tokens[32:65]):
            logits, _ = target(w[None, :-1], impl="torch")
            nll += cross_entropy(logits[0].double(), w[1:], reduction="sum").item()
    assert math.isclose(perplexity(target, tokens, 32, 64), math.exp(nll / 64), rel_tol=1e-9)
    with pytest.raises(ValueError, match=r"^evaluation text has 64 tokens; need 65$"):
        perplexity(target, tokens[:64], 32, 64)
    # whole windows only: 63 tokens asked of windows of 32 score the first window, as 32 do
    one = perplexity(target, tokens, 32, 32)
    assert perplexity(target, tokens, 32, 63) == one != perplexity(target, tokens, 32, 64)
    with pytest.raises(ValueError, match=r"^n_tokens=16 scores no whole window of context 32$"):
        perplexity(target, tokens, 32, 16)

def test_checkpoint_round_trip_and_config_check(trained, tmp_path):
    target, head, _, _, _ = trained
    preset = wmtp.get_preset("tiny")
    meta = checkpoint_meta(preset, "synthetic", "abc", 0)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, target, head, meta)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temp file left behind
    t2, h2 = wmtp.build_models("tiny", seed=5)
    assert weights_sha256(t2, h2) != weights_sha256(target, head)
    load_checkpoint(path, t2, h2, meta)
    assert torch.equal(t2.embed, target.embed) and torch.equal(h2.proj, head.proj)
    assert weights_sha256(t2, h2) == weights_sha256(target, head)  # fresh models, the saved weights
    other = checkpoint_meta(dataclasses.replace(preset, train=dataclasses.replace(preset.train, lr=1.0)),
                            "synthetic", "abc", 0)
    with pytest.raises(ValueError, match="another config.*train"):
        load_checkpoint(path, t2, h2, other)
    with pytest.raises(ValueError, match="another config.*version"):  # made by other training code
        load_checkpoint(path, t2, h2, {**meta, "version": meta["version"] + 1})
    with pytest.raises(ValueError, match=r"another config \(differs in: seed\)"):  # a key the caller lacks
        load_checkpoint(path, t2, h2, {k: v for k, v in meta.items() if k != "seed"})
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read: not a file torch.save wrote"):
        load_checkpoint(tmp_path / "junk.pt", t2, h2, meta)
    with pytest.raises(ValueError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt", t2, h2, meta)
    with pytest.raises(ValueError, match="cannot read checkpoint .*: Is a directory"):
        load_checkpoint(tmp_path, t2, h2, meta)
    # KeyError, TypeError, AttributeError or load_state_dict's RuntimeError of many lines before
    small_target, small_head = wmtp.build_models("small")
    with pytest.raises(ValueError, match="holds no target weights of this TargetLM's names and shapes"):
        load_checkpoint(path, small_target, small_head, meta)  # tiny weights, meta of the caller's making
    t3, _ = wmtp.build_models("tiny", seed=7)
    before = t3.embed.clone()
    with pytest.raises(ValueError, match="holds no head weights of this TargetLM's"):
        load_checkpoint(path, t3, wmtp.TargetLM(preset.model), meta)  # checked before the target loads
    assert torch.equal(t3.embed, before) and not torch.equal(t3.embed, target.embed)
    torch.save({"meta": meta}, tmp_path / "no_weights.pt")
    with pytest.raises(ValueError, match="holds no target weights"):
        load_checkpoint(tmp_path / "no_weights.pt", t2, h2, meta)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="holds no target weights"):
        load_checkpoint(tmp_path / "list.pt", t2, h2, {})
    torch.save({"meta": "tiny"}, tmp_path / "str_meta.pt")
    with pytest.raises(ValueError, match="another config"):
        load_checkpoint(tmp_path / "str_meta.pt", t2, h2, meta)
    with pytest.raises(ValueError, match="checkpoint path must be a str or a Path, got NoneType"):
        load_checkpoint(None, t2, h2, meta)
    with pytest.raises(ValueError, match=r"meta must be a dict \(checkpoint_meta's\), got NoneType"):
        load_checkpoint(path, t2, h2, None)



def test_checkpoint_with_a_weight_that_is_no_tensor_is_refused_by_name(tmp_path):
    """A head entry of the right name holding a list (no ``.shape``) is the one-line ValueError, not an
    AttributeError, and nothing loads: the target keeps its own weights."""
    target, head = wmtp.build_models("tiny", seed=0)
    weights = head.state_dict()
    weights[next(iter(weights))] = [0.0]
    torch.save({"meta": {}, "target": wmtp.build_models("tiny", seed=1)[0].state_dict(), "head": weights},
               tmp_path / "list_weight.pt")
    before = target.embed.clone()
    with pytest.raises(ValueError, match="holds no head weights of this MTPHead's names and shapes"):
        load_checkpoint(tmp_path / "list_weight.pt", target, head, {})
    assert torch.equal(target.embed, before)


class _RunsOnLoad:
    """A pickled object whose loading calls a function: here ``_RAN.append``, in a hostile file anything."""

    def __reduce__(self):
        return _RAN.append, ("ran",)


_RAN: list = []


def test_a_checkpoint_that_would_run_code_is_refused_unloaded(tmp_path):
    """``--checkpoint`` takes a path from the user: only tensors and plain containers are unpickled
    (``weights_only``), so a file whose loading calls a function is the unreadable-file error and the
    function never runs (session 54: loading it whole passed every test)."""
    target, head = wmtp.build_models("tiny", seed=0)
    torch.save({"meta": _RunsOnLoad(), "target": target.state_dict(), "head": head.state_dict()}, tmp_path / "x.pt")
    _RAN.clear()
    with pytest.raises(ValueError, match="cannot be read: not a file torch.save wrote, or a damaged one"):
        load_checkpoint(tmp_path / "x.pt", target, head, {})
    assert _RAN == []


def test_checkpoint_meta_names_everything_a_checkpoint_must_match_as_json():
    """The configs, corpus, its fingerprint, seed and CHECKPOINT_VERSION, in JSON's terms (a tuple
    field such as global_layers as a list, so the meta equals its own JSON round trip)."""
    import json

    meta = checkpoint_meta(wmtp.get_preset("tiny"), "wikitext-103", "f00d", 3)
    assert list(meta) == ["model", "mtp", "train", "corpus", "corpus_fingerprint", "seed", "version"]
    assert (meta["corpus"], meta["corpus_fingerprint"], meta["seed"], meta["version"]) == ("wikitext-103", "f00d", 3, 1)
    assert meta["model"]["global_layers"] == [1] and meta["mtp"] == {"train_depth": 2, "rope": True}
    assert json.loads(json.dumps(meta)) == meta

def test_weights_sha256_digests_every_entry_of_both_models():
    """The docstring's digest: name, dtype, shape and bytes of each entry, sorted, the target's then the
    head's; one element of either model, or another dtype, gives another digest; seeds make the same one."""
    target, head = wmtp.build_models("tiny", seed=0)
    h = hashlib.sha256()
    for prefix, model in (("target.", target), ("head.", head)):
        for name, w in sorted(model.state_dict().items()):
            h.update(f"{prefix}{name}\0float32\0{list(w.shape)}\0".encode() + w.numpy().tobytes())
    digest = weights_sha256(target, head)
    assert digest == h.hexdigest()[:16] == weights_sha256(*wmtp.build_models("tiny", seed=0))
    assert weights_sha256(target.double(), head.double()) != digest  # the same values, other bytes
    for w in (target.float().embed, head.float().proj, head.block.mlp.w_down):
        before = w.detach().clone()
        with torch.no_grad():
            w.view(-1)[-1] += 1e-3
            changed = weights_sha256(target, head)
            w.copy_(before)
        assert changed != digest
    assert weights_sha256(target, head) == digest


def test_perplexity_scores_the_same_text_in_windows(trained):
    """Two windows of 128 tokens: the mean NLL over both, each window read from its own start."""
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


def test_learning_rate_warms_up_linearly_then_follows_a_cosine():
    from wmtp.train import _lr

    # warmup 4 of 10 steps: (step + 1) / 4, then 0.5 (1 + cos(pi (step - 4) / 6))
    assert [_lr(s, 2.0, 4, 10) for s in range(4)] == [0.5, 1.0, 1.5, 2.0]
    assert _lr(4, 2.0, 4, 10) == 2.0 and math.isclose(_lr(7, 2.0, 4, 10), 1.0) and _lr(10, 2.0, 4, 10) == 0.0
    assert _lr(0, 2.0, 0, 1) == 2.0  # no warmup, one step: the cosine's start


def _one_param_run(losses, **cfg):
    """``_optimise`` over a weight ``w`` (2, 2) and a bias ``b`` (2,), all ones, for ``len(losses)`` steps
    at lr 0.1 (warmup 1: every step at 0.1 for two steps); ``losses[i](w, b)`` is step i's loss."""
    from wmtp.train import _optimise

    w = torch.nn.Parameter(torch.ones(2, 2, dtype=torch.float64))
    b = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    calls = iter(losses)
    _optimise([w, b], lambda: next(calls)(w, b), len(losses), 0.1,
              dataclasses.replace(CFG, warmup_steps=1, **cfg), "test", progress=False)
    return w.detach(), b.detach()


def test_weight_decay_only_on_matrices():
    """A zero gradient: Adam moves nothing and decoupled weight decay scales ``w`` by 1 - lr * wd = 0.95,
    the 1-D bias left alone."""
    w, b = _one_param_run([lambda w, b: 0 * (w.sum() + b.sum())], weight_decay=0.5)
    assert torch.allclose(w, torch.full((2, 2), 0.95, dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.equal(b, torch.ones(2, dtype=torch.float64))


def test_gradients_are_clipped_and_not_accumulated():
    """Adam's first step moves each entry by lr * g / (|g| + 1e-8): 0.1 for a gradient of 1, about
    7e-6 for ``b``'s gradient (1, 1) clipped to norm 1e-12 (each entry 1e-12 / sqrt 2). Then a
    gradient of -1 (the first one zeroed, not added): m = 0.9 * 0.1 - 0.1 = -0.01 and v = 0.95 * 0.05 +
    0.05 = 0.0975, bias-corrected -0.01 / 0.19 and 1, so ``b`` moves up by 0.1 / 19 (an accumulated
    gradient of 0 would move it down again)."""
    up = lambda w, b: b.sum()  # noqa: E731
    down = lambda w, b: -b.sum()  # noqa: E731
    _, b = _one_param_run([up], weight_decay=0.0, grad_clip=1e-12)
    g = 1e-12 / math.sqrt(2)
    assert torch.allclose(b, torch.full((2,), 1 - 0.1 * g / (g + 1e-8), dtype=torch.float64), rtol=0, atol=1e-10)
    _, b = _one_param_run([up], weight_decay=0.0, grad_clip=math.inf)
    assert torch.allclose(b, torch.full((2,), 0.9, dtype=torch.float64), rtol=0, atol=1e-8)
    _, b = _one_param_run([up, down], weight_decay=0.0, grad_clip=math.inf)
    assert torch.allclose(b, torch.full((2,), 0.9 + 0.1 / 19, dtype=torch.float64), rtol=0, atol=1e-8)



def test_adam_s_second_moment_decays_at_0_95():
    """AdamW's betas are (0.9, 0.95): a gradient of 1, then of -2, gives m = 0.9 * 0.1 - 0.2 = -0.11 and
    v = 0.95 * 0.05 + 0.05 * 4 = 0.2475, bias-corrected -0.11 / 0.19 and 0.2475 / 0.0975 = 4.95 / 1.95, so
    ``b`` moves from 0.9 up by 0.1 * (0.11 / 0.19) / sqrt(4.95 / 1.95) (beta2 0.999 gives 0.93661...). A
    gradient of 1 then -1, as above, cannot tell: its corrected v is 1 for any beta2."""
    up = lambda w, b: b.sum()  # noqa: E731
    down2 = lambda w, b: -2 * b.sum()  # noqa: E731
    _, b = _one_param_run([up, down2], weight_decay=0.0, grad_clip=math.inf)
    assert torch.allclose(b, torch.full((2,), 0.9363373950477333, dtype=torch.float64), rtol=0, atol=1e-8)


def test_training_leaves_both_models_in_eval_mode():
    """train_target and train_head switch their model to training mode and back to eval mode when
    done (no steps needed to see it)."""
    target, head = wmtp.build_models("tiny", seed=0)
    cfg = dataclasses.replace(CFG, target_steps=0, head_steps=0)
    assert train_target(target, synthetic_tokens(1000), cfg, torch.Generator().manual_seed(0), progress=False) == []
    assert not any(m.training for m in target.modules())
    assert train_head(head, target, synthetic_tokens(1000), cfg, torch.Generator().manual_seed(0),
                      progress=False) == []
    assert not any(m.training for m in head.modules())



def test_one_step_moves_every_parameter_and_the_head_s_leaves_the_target_without_gradients():
    """``train_target`` and ``train_head`` take ``parameters()``, a generator read more than once (the
    decayed matrices, the rest, the clipping): one step moves every target and head parameter, the
    1-D norm weights too. The head's step leaves no gradient on the target's (shared) weights."""
    target, head = wmtp.build_models("tiny", seed=0)
    tokens, cfg = synthetic_tokens(1000), dataclasses.replace(CFG, target_steps=1, head_steps=1, seq_len=8)
    for model, train in ((target, lambda g: train_target(target, tokens, cfg, g, progress=False)),
                         (head, lambda g: train_head(head, target, tokens, cfg, g, progress=False))):
        before = {k: v.clone() for k, v in model.named_parameters()}
        train(torch.Generator().manual_seed(0))
        assert [k for k, v in model.named_parameters() if torch.equal(v, before[k])] == []
        assert any(v.dim() == 1 for v in before.values())
        if model is target:
            target.zero_grad(set_to_none=True)  # the target's own last step left its gradients
    assert [k for k, v in target.named_parameters() if v.grad is not None] == []


def test_target_loss_is_next_token_cross_entropy_over_seq_len_positions():
    """A target step's loss is the cross-entropy of windows of seq_len + 1 tokens, each position
    predicting the next, worked out here from the same window draws."""
    from torch.nn.functional import cross_entropy

    from wmtp.train import random_windows

    target, _ = wmtp.build_models("tiny", seed=0)
    tokens, cfg = synthetic_tokens(1000), dataclasses.replace(CFG, target_steps=1, batch_size=2, seq_len=8)
    with torch.no_grad():
        x = random_windows(tokens, 2, 9, torch.Generator().manual_seed(5))
        logits, _ = target(x[:, :-1], impl="torch")
        want = cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).item()
    [loss] = train_target(target, tokens, cfg, torch.Generator().manual_seed(5), progress=False)
    assert math.isclose(loss, want, rel_tol=1e-6)


def test_each_model_trains_at_its_own_rate_and_the_bar_shows_each_step_s_loss(monkeypatch):
    """The target trains ``target_steps`` at ``lr``, the head ``head_steps`` at ``head_lr`` under their
    own labels; the bar advances one step at a time showing that step's loss."""
    import wmtp.train as train

    calls, updates = [], []
    real = train._optimise
    monkeypatch.setattr(train, "_optimise", lambda params, fn, steps, lr, cfg, label, progress: calls.append(
        (steps, lr, label)) or real(params, fn, steps, lr, cfg, label, progress))
    real_lr, schedule = train._lr, []  # each step's rate: its model's own warmup and cosine over its own steps
    monkeypatch.setattr(train, "_lr", lambda *a: schedule.append(a) or real_lr(*a))

    class Bar:
        def __init__(self, *columns, disable):
            self.disable = disable

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def add_task(self, label, total, loss):
            updates.append((label, total, loss))
            return 7

        def update(self, task, **fields):
            updates.append((task, fields))

    monkeypatch.setattr(train, "Progress", Bar)
    target, head = wmtp.build_models("tiny", seed=0)
    cfg = dataclasses.replace(CFG, target_steps=2, head_steps=1, lr=1e-2, head_lr=3e-3, batch_size=2, seq_len=8)
    losses = train_target(target, synthetic_tokens(1000), cfg, torch.Generator().manual_seed(0), progress=False)
    assert updates[0][:2] == ("target LM", 2) and math.isnan(updates[0][2])
    assert updates[1:] == [(7, {"advance": 1, "loss": losses[0]}), (7, {"advance": 1, "loss": losses[1]})]
    train_head(head, target, synthetic_tokens(1000), cfg, torch.Generator().manual_seed(0), progress=False)
    assert calls == [(2, 1e-2, "target LM"), (1, 3e-3, "MTP head")]
    w = cfg.warmup_steps  # the head's cosine over the target's steps survived (session 54)
    steps = [(0, 1e-2, w, 2), (1, 1e-2, w, 2), (0, 3e-3, w, 1)]
    assert schedule == [x for x in steps for _group in ("matrices", "the rest")]  # set for each parameter group

def test_head_loss_is_the_mean_of_its_draft_steps_cross_entropies():
    """A head step's loss is the mean over the draft steps 1 .. train_depth of each step's cross-entropy
    against the token k + 1 ahead (not their sum), worked out here from the same window draws."""
    from torch.nn.functional import cross_entropy

    from wmtp.train import head_step_logits, random_windows

    target, head = wmtp.build_models("tiny", seed=0)
    depth, tokens = head.config.train_depth, synthetic_tokens(1000)
    cfg = dataclasses.replace(CFG, head_steps=1, batch_size=2, seq_len=8)
    with torch.no_grad():
        x = random_windows(tokens, 2, 8 + depth + 1, torch.Generator().manual_seed(5))
        steps = head_step_logits(head, target, x, depth)
        want = sum(cross_entropy(lg.flatten(0, 1), x[:, k + 1 : k + 9].flatten()).item()
                   for k, lg in enumerate(steps, start=1)) / depth
    assert depth > 1
    [loss] = train_head(head, target, tokens, cfg, torch.Generator().manual_seed(5), progress=False)
    assert math.isclose(loss, want, rel_tol=1e-6)

def test_head_steps_read_the_targets_hidden_then_their_own():
    """Step 1 reads the target's hidden states at positions 0 .. L-1 and the tokens 1 .. L, step k the
    hidden states step k - 1 returned and the tokens k .. k + L - 1; each step's logits are its own."""
    from wmtp.train import head_step_logits

    target, head = wmtp.build_models("tiny", seed=0)
    x = torch.randint(0, target.config.vocab_size, (2, 10 + 3 + 1), generator=torch.Generator().manual_seed(0))
    seen = []

    def spy(hidden, ids, impl):
        out = head(hidden, ids, impl=impl)
        seen.append((hidden, ids, out))
        return out

    steps = head_step_logits(spy, target, x, 3)
    with torch.no_grad():
        _, h = target(x[:, :10], impl="torch")
    assert torch.equal(seen[0][0], h)
    for k in range(1, 4):
        hidden, ids, (logits, g) = seen[k - 1]
        assert torch.equal(ids, x[:, k : k + 10]) and steps[k - 1] is logits
        if k > 1:
            assert hidden is seen[k - 2][2][1]


def test_head_accuracy_of_a_head_that_is_always_right_is_one():
    """On a text where token t + 1 is token t + 1 mod V, a head guessing ``(id + 1) mod V`` for the token
    after ``id`` is right at every position of every window and depth: accuracy exactly 1."""
    target, _ = wmtp.build_models("tiny", seed=0)
    V = target.config.vocab_size

    class Successor(torch.nn.Module):
        proj = torch.zeros(1)

        def forward(self, hidden, ids, impl):
            return torch.nn.functional.one_hot((ids + 1) % V, V).double(), hidden

    tokens = torch.arange(3 * V) % V
    assert head_accuracy(Successor(), target, tokens, 3, 16, 5, torch.Generator().manual_seed(0)) == [1.0, 1.0, 1.0]
