"""Target LM, MTP head and KV cache: incremental decoding equals a full pass, stale cache entries
are never read (no rollback needed), weights come from an explicit generator."""

import copy
import json
import math
import os
import random
import types
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from op_impls import spy_attention_plans

import wmtp
from wmtp.config import KeySetConfig, ModelConfig, MTPConfig, SpecConfig, TrainConfig
from wmtp.kvcache import KVCache

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def models():
    target, head = wmtp.build_models("tiny", seed=0)
    return target.double(), head.double()


def test_cached_decoding_matches_one_full_pass(models):
    """Prefill + one-token steps through the position-indexed cache == a cache-free full forward."""
    target, _ = models
    ids = torch.randint(0, 512, (1, 70), generator=torch.Generator().manual_seed(0))
    full, _ = target(ids)
    cache = target.new_cache(1, 128)
    parts = [target(ids[:, :30], torch.arange(30), cache)[0]]
    for p in range(30, 70, 5):  # chunks of 5, like verify passes
        parts.append(target(ids[:, p:p + 5], torch.arange(p, p + 5), cache)[0])
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
                    reason="needs CUDA or TRITON_INTERPRET=1")
@torch.no_grad()
def test_a_pass_without_a_cache_runs_the_triton_kernels(monkeypatch):
    """Without a cache the rotated keys and the projected values lie in two layouts, which the Triton
    attention refuses: the model hands it both in one, and a target and a head pass with
    impl='triton' match the reference's (a batch of two, both kinds of layer) and launch the kernel
    for every layer (a pass that fell back to the reference matched too)."""
    target, head = (m.to(DEVICE).float() for m in wmtp.build_models("tiny", seed=0))
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    plans = spy_attention_plans(monkeypatch)
    logits, hidden = target(ids, impl="triton")
    assert len(plans) == target.config.n_layers
    ref, ref_hidden = target(ids, impl="torch")
    assert len(plans) == target.config.n_layers  # the reference launches nothing
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(head(hidden, ids, impl="triton")[0], head(ref_hidden, ids, impl="torch")[0],
                               rtol=1e-4, atol=1e-4)
    assert len(plans) == target.config.n_layers + 1  # the head's one layer


def test_stale_positions_are_never_read(models):
    """Garbage past the current position (rejected drafts) leaves the output unchanged."""
    target, head = models
    ids = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(1))
    clean = target.new_cache(1, 64)
    ref, hid = target(ids, torch.arange(40), clean)
    dirty = target.new_cache(1, 64)
    dirty.k.fill_(float("nan"))
    dirty.v.fill_(float("nan"))
    out, _ = target(ids, torch.arange(40), dirty)
    assert torch.equal(out, ref)
    dcache = head.new_cache(1, 64)
    dcache.k[..., 40:, :] = 1e30  # stale speculative draft KV beyond the extend
    a, _ = head(hid, ids, torch.arange(40), dcache, n_sink=4, window=8)
    b, _ = head(hid, ids, torch.arange(40), head.new_cache(1, 64), n_sink=4, window=8)
    assert torch.equal(a, b)


def test_head_shares_but_does_not_own_the_target_weights(models):
    target, head = models
    names = set(head.state_dict())
    assert not any("embed" == n or n.startswith("target") for n in names)
    assert {"proj", "hidden_norm.weight", "embed_norm.weight"} <= names
    assert head.target is target


def test_head_input_norms_the_hidden_state_and_the_embedding_each_with_its_own_weight():
    """``x_t = W [norm_h(h_t) ; norm_e(Emb(token_{t+1}))]`` with the two norms' own weights, here made
    unlike (both start at ones, so swapping them changes nothing before training)."""
    from wmtp.rmsnorm import rms_norm_torch

    target, _ = wmtp.build_models("tiny", seed=0)
    target = target.double()
    head = wmtp.MTPHead(MTPConfig(), target).double()
    d = target.config.d_model
    with torch.no_grad():
        head.hidden_norm.weight.copy_(torch.linspace(0.5, 1.5, d))
        head.embed_norm.weight.copy_(torch.linspace(2.0, -1.0, d))
    g = torch.Generator().manual_seed(0)
    h, ids = torch.randn(2, 3, d, generator=g, dtype=torch.float64), torch.tensor([[1, 2, 3], [4, 5, 6]])
    eps = target.config.norm_eps  # both norms the target's eps (1e-5), at 1e-12 another shows
    want = torch.cat([rms_norm_torch(h, head.hidden_norm.weight, eps),
                      rms_norm_torch(target.embed[ids], head.embed_norm.weight, eps)], -1) @ head.proj.T
    with torch.no_grad():
        assert torch.allclose(head.inputs(h, ids, "torch"), want, rtol=0, atol=1e-12)


def test_weights_come_from_the_seed_not_global_rng():
    state = torch.random.get_rng_state()
    a, ha = wmtp.build_models("tiny", seed=3)
    b, hb = wmtp.build_models("tiny", seed=3)
    c, _ = wmtp.build_models("tiny", seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a.embed, b.embed) and torch.equal(ha.proj, hb.proj)
    assert not torch.equal(a.embed, c.embed)
    assert not a.training and not ha.training


def test_hybrid_layers():
    target, _ = wmtp.build_models("tiny")
    cfg = target.config
    for i, block in enumerate(target.layers):
        is_global = i in cfg.global_layers
        assert block.attn.rope is not is_global and block.attn.logn_scale is is_global
        assert target.layer_key_set(i) == ((0, None) if is_global else (0, cfg.local_window))


@pytest.mark.parametrize("kwargs,match", [
    (dict(d_model=65), "divisible"), (dict(n_kv_heads=3), "divisible"),
    (dict(global_layers=(7,)), "global_layers"), (dict(local_window=0), "window"),
    (dict(train_seq_len=1), "train_seq_len"),
    # each was a ZeroDivisionError, a TypeError, or a config accepted that fails (or decodes garbage) later
    (dict(n_heads=0), "n_heads must be an integer >= 1, got 0"), (dict(n_kv_heads=0), "n_kv_heads"),
    (dict(d_model=0), "d_model"), (dict(d_model=-128), "d_model"), (dict(d_model=128.0), "d_model"),
    (dict(vocab_size=0), "vocab_size"), (dict(vocab_size=True), "vocab_size"), (dict(vocab_size=4096.0), "vocab_size"),
    (dict(n_layers=0, global_layers=()), "n_layers"), (dict(n_layers=2.5, global_layers=()), "n_layers"),
    (dict(d_ff=0), "d_ff"), (dict(max_seq_len=0), "max_seq_len"), (dict(max_seq_len=-1), "max_seq_len"),
    (dict(rope_theta=0), "rope_theta"), (dict(rope_theta=-1.0), "rope_theta"),
    (dict(rope_theta=float("nan")), "rope_theta"), (dict(norm_eps=-1.0), "norm_eps"),
    (dict(norm_eps=float("nan")), "norm_eps"), (dict(global_layers=1), "global_layers"),
    (dict(global_layers=(1.5,)), "global_layers"), (dict(train_seq_len=None), "train_seq_len"),
    # mutation round 4: a bool index, and the range's two sides (4 layers: 0 .. 3), each got through
    (dict(global_layers=(True,)), "global_layers"), (dict(global_layers=(-1,)), "global_layers"),
    (dict(global_layers=(4,)), "global_layers"),
])
def test_bad_model_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("cls,kwargs,match", [
    (MTPConfig, dict(train_depth=0), "train_depth"), (MTPConfig, dict(train_depth=2.0), "train_depth"),
    (MTPConfig, dict(rope="no"), "rope must be True or False"),
    (SpecConfig, dict(keysets=((4, 16),)), "keysets must be a non-empty tuple of KeySetConfig"),  # an AttributeError
    (SpecConfig, dict(keysets=()), "keysets"), (SpecConfig, dict(contexts=(0,)), "contexts"),
    (SpecConfig, dict(contexts=()), "contexts"), (SpecConfig, dict(contexts=(64.5,)), "contexts"),
    (SpecConfig, dict(ppl_contexts=(-5,)), "ppl_contexts"), (SpecConfig, dict(new_tokens=0), "new_tokens"),
    (SpecConfig, dict(repeats=0), "repeats"),
    (SpecConfig, dict(contexts=(64, 128, 64)), "context 64 is given twice"),  # the CLI's check, without a run
    (SpecConfig, dict(keysets=(KeySetConfig(4, 16), KeySetConfig(0, None), KeySetConfig(4, 16))),
     r"key set sink4\+win16 is given twice"),
    (TrainConfig, dict(batch_size=0), "batch_size"), (TrainConfig, dict(batch_size=8.0), "batch_size"),
    (TrainConfig, dict(seq_len=0), "seq_len"), (TrainConfig, dict(target_steps=-1), "target_steps"),
    (TrainConfig, dict(warmup_steps=-1), "warmup_steps"), (TrainConfig, dict(lr=-1.0), "lr"),
    (TrainConfig, dict(head_lr=float("nan")), "head_lr"), (TrainConfig, dict(weight_decay=-0.1), "weight_decay"),
    (TrainConfig, dict(grad_clip=0.0), "grad_clip"), (TrainConfig, dict(max_train_chars=0), "max_train_chars"),
])
def test_bad_configs(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_config_edges_that_stay_valid():
    assert ModelConfig(global_layers=[1, 3]).global_layers == (1, 3)  # a list reads as the tuple
    spec = SpecConfig(keysets=[KeySetConfig(0, None)], contexts=[64, 128], ppl_contexts=[64])  # in every tuple field
    assert (spec.keysets, spec.contexts, spec.ppl_contexts) == ((KeySetConfig(0, None),), (64, 128), (64,))
    assert hash(spec) == hash(SpecConfig(keysets=(KeySetConfig(0, None),), contexts=(64, 128), ppl_contexts=(64,)))
    assert TrainConfig(grad_clip=float("inf"), max_train_chars=None).grad_clip == float("inf")  # no clipping
    assert ModelConfig(norm_eps=0.0, local_window=None).norm_eps == 0.0
    assert ModelConfig(global_layers=(0, 3)).global_layers == (0, 3)  # the range's two ends
    zero = TrainConfig(target_steps=0, head_steps=0, warmup_steps=0)  # the lows are 0: no steps, no warmup
    assert (zero.target_steps, zero.head_steps, zero.warmup_steps) == (0, 0, 0)


def test_the_presets_are_the_committed_runs_configs():
    """``small`` (and so every default: the paper's depth 7, 64 sinks, 4096 keys) is the config the committed
    CPU reproductions recorded, field for field; ``tiny``'s model is literal (mutation round 4: changes to
    both presets and the defaults survived every test)."""
    root = Path(__file__).resolve().parent.parent
    for name in ("wikitext-2-seed42.json", "python-stdlib-seed42.json"):
        config = json.loads((root / "metrics" / name).read_text())["config"]
        p = wmtp.get_preset(config["preset"])
        assert config["preset"] == "small"
        assert config == json.loads(json.dumps({"preset": p.name, "model": asdict(p.model), "mtp": asdict(p.mtp),
                                                "train": asdict(p.train), "spec": asdict(p.spec)})), name
    assert asdict(wmtp.get_preset("tiny").model) == {
        "vocab_size": 512, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 128, "local_window": 16,
        "global_layers": (1,), "rope_theta": 10000.0, "train_seq_len": 64, "max_seq_len": 2048, "norm_eps": 1e-05,
        "head_dim": 16}
    assert (SpecConfig().depth, KeySetConfig().n_sink, KeySetConfig().window) == (7, 64, 4096)


@pytest.mark.parametrize("name", [["tiny"], None, "TINY"])
def test_bad_preset_names(name):
    with pytest.raises(ValueError, match="unknown preset"):  # a list was a TypeError (unhashable)
        wmtp.get_preset(name)


def test_rope_needs_an_even_head_dim():
    odd = ModelConfig(vocab_size=50, d_model=36, n_heads=4, n_kv_heads=2, d_ff=16, n_layers=2, global_layers=(1,))
    with pytest.raises(ValueError, match="even"):  # head_dim 9: layer 0 is local (RoPE)
        wmtp.TargetLM(odd)
    wmtp.TargetLM(ModelConfig(vocab_size=50, d_model=36, n_heads=4, n_kv_heads=2, d_ff=16, n_layers=1,
                         global_layers=(0,)))  # no RoPE layer: any head_dim


def test_fp16_global_layers_stay_finite_past_65519():
    """The NoPE layers' log-length scale is computed in fp32: fp16 rounds positions past 65519 to inf."""
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64, local_window=4,
                      global_layers=(1,), train_seq_len=8, max_seq_len=65_602)
    tokens, pos = torch.tensor([[1, 2, 3]]), torch.tensor([65_000, 65_519, 65_600])
    logits, base = {}, wmtp.TargetLM(cfg).eval()
    for dtype in (torch.float32, torch.float16):
        target = copy.deepcopy(base).to(dtype)  # the same weights in both dtypes
        with torch.no_grad():
            logits[dtype] = target(tokens, pos, target.new_cache(1))[0].float()  # (1, 3, V)
    assert logits[torch.float16].isfinite().all()
    torch.testing.assert_close(logits[torch.float16], logits[torch.float32], atol=0.05, rtol=0.05)


def test_cache_refuses_positions_past_its_end():
    cache = KVCache(1, 1, 2, 8, 4)
    with pytest.raises(ValueError, match="fit in a KV cache"):
        cache.update(0, torch.tensor([8]), torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))


@pytest.mark.parametrize("layer, pos, shape, match", [
    (-1, [3], (1, 2, 1, 4), "layer"), (2, [3], (1, 2, 1, 4), "layer"),  # -1 wrote the last layer, silently
    (0, [-1], (1, 2, 1, 4), "do not fit"), (0, [], (1, 2, 0, 4), "non-empty"), (0, [1.0], (1, 2, 1, 4), "integer"),
    (0, [3], (1, 2, 2, 4), "must be"), (0, [3], (1, 1, 1, 4), "must be"),
])
def test_cache_update_refuses_bad_arguments(layer, pos, shape, match):
    cache = KVCache(2, 1, 2, 8, 4)
    with pytest.raises(ValueError, match=match):
        cache.update(layer, torch.tensor(pos), torch.zeros(shape), torch.zeros(shape))
    assert not cache.k.any()  # nothing written
    k, _ = cache.update(1, torch.tensor([3], dtype=torch.int32), torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert k[:, :, 3].eq(1).all() and cache.k[0].eq(0).all()  # int32 positions, the named layer only


@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_cache_writes_keys_at_their_positions_only(pos_dtype):
    """Permuted positions of any integer dtype (uint8 would index as a boolean mask), a strided
    source (as RoPE'd keys and transposed values are), a narrower dtype: each key lands at its own
    position of its own layer, nothing else moves."""
    g = torch.Generator().manual_seed(0)
    cache = KVCache(2, 2, 3, 10, 4, dtype=torch.float64)
    before = cache.k.clone()
    pos = torch.tensor([7, 2, 5], dtype=pos_dtype)
    k = torch.randn(2, 4, 3, 3, generator=g).transpose(1, 3)  # (B, Hkv, L, D) = (2, 3, 3, 4), strided
    v = torch.randn(2, 3, 3, 4, generator=g, dtype=torch.float16)  # (B, Hkv, L, D)
    ck, cv = cache.update(1, pos, k, v)
    for i, p in enumerate(pos.tolist()):
        assert torch.equal(ck[:, :, p], k[:, :, i].double()) and torch.equal(cv[:, :, p], v[:, :, i].double())
    untouched = [p for p in range(10) if p not in pos.tolist()]
    assert torch.equal(cache.k[1][:, :, untouched], before[1][:, :, untouched]) and torch.equal(cache.k[0], before[0])


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        wmtp.build_models("huge")
    for seed in (1.5, True, None, 2**70, 2**64, -1):  # torch's RuntimeError before (2**70: "Overflow ...")
        with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64\)"):  # -1 would draw 2**64 - 1's
            wmtp.build_models("tiny", seed=seed)
    a, b = wmtp.build_models("tiny", seed=2**64 - 1), wmtp.build_models("tiny", seed=0)  # the range's two ends
    assert not torch.equal(a[0].embed, b[0].embed)
    with pytest.raises(ValueError, match="unknown preset"):
        wmtp.build_models(["tiny"])  # a TypeError (unhashable) before


SMALL = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=16, global_layers=())


@pytest.mark.parametrize("build,match", [  # each was an AttributeError or a TypeError from deep inside
    (lambda t: wmtp.TargetLM(None), "config must be a wmtp.ModelConfig, got NoneType"),
    (lambda t: wmtp.TargetLM("tiny"), "config must be a wmtp.ModelConfig, got str"),
    (lambda t: wmtp.TargetLM(wmtp.get_preset("tiny")), "got Preset"),
    (lambda t: wmtp.TargetLM(SMALL, generator=5), "generator must be None or a CPU torch.Generator, got int"),
    (lambda t: wmtp.TargetLM(SMALL, generator=random.Random(0)), "generator .* got Random"),
    (lambda t: wmtp.MTPHead(MTPConfig(), None), r"MTPHead takes \(MTPConfig, TargetLM\), got \(MTPConfig, NoneType\)"),
    (lambda t: wmtp.MTPHead(t, MTPConfig()), r"got \(TargetLM, MTPConfig\)"),  # arguments swapped
    (lambda t: wmtp.MTPHead(t.config, t), r"got \(ModelConfig, TargetLM\)"),
    (lambda t: wmtp.MTPHead(MTPConfig(), t, generator=5), "generator"),
])
def test_bad_model_construction(build, match):
    with pytest.raises(ValueError, match=match):
        build(wmtp.TargetLM(SMALL))


def test_zero_biases_are_buffers_outside_checkpoints():
    """NOTE [Few-row products]: ``linear``'s zero biases follow the model's dtype and device, never
    its ``state_dict`` (checkpoints stay as they were), and stay zero, even after a build on the meta
    device filled by ``load_state_dict``."""
    target, head = wmtp.build_models("tiny", seed=0)
    assert not [k for k in (*target.state_dict(), *head.state_dict()) if k.endswith("zero")]
    zeros = [b for m in (target, head) for name, b in m.named_buffers() if name.endswith("zero")]
    assert len(zeros) == 2 * target.config.n_layers + 1 + 2 + 1  # attention and MLP per layer, LM head; head's
    assert all(b.dtype == torch.float64 and not b.any()
               for name, b in target.double().named_buffers() if name.endswith("zero"))
    with torch.device("meta"):
        empty, empty_head = wmtp.TargetLM(target.config), wmtp.MTPHead(head.config, target)
    empty, empty_head = empty.to_empty(device="cpu").double(), empty_head.to_empty(device="cpu").double()
    for m in (empty, empty_head):
        for name, b in m.named_buffers():
            b.fill_(7.0)  # what uninitialised memory may hold
    empty.load_state_dict(target.state_dict())
    empty_head.load_state_dict(head.double().state_dict())
    assert all(not b.any() for m in (empty, empty_head) for name, b in m.named_buffers() if name.endswith("zero"))


def _routed(monkeypatch):
    """Route every product of 2 .. FEW_ROWS rows through addmm on the CPU too, counting biased calls."""
    import torch.nn.functional as F

    from wmtp import linear as products

    calls = []
    plain = F.linear
    monkeypatch.setattr(products, "few_rows", lambda x, rows: 1 < rows <= products.FEW_ROWS)
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: calls.append(b is not None) or plain(x, w, b))
    return calls, plain


def test_linear_off_cuda_is_f_linear(monkeypatch):
    """Off CUDA every product is ``F.linear`` without a bias, whatever its rows (the CPU's numbers do
    not move: NOTE [Few-row products])."""
    import torch.nn.functional as F

    from wmtp.linear import linear

    biased = []
    plain = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: biased.append(b is not None) or plain(x, w, b))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(12, 8, generator=g)
    for rows in (1, 2, 8, 16, 17):
        x = torch.randn(1, rows, 8, generator=g)
        assert torch.equal(linear(x, w, torch.zeros(12)), plain(x, w))
    assert biased == [False] * 5


def test_few_rows_are_2_to_16_on_cuda():
    """The route's bounds (NOTE [Few-row products]), on a stand-in for a CUDA tensor (only ``is_cuda``
    is read; the CUDA test below runs them through ``linear``): 2 to 16 rows, none on the CPU."""
    from types import SimpleNamespace

    from wmtp.linear import few_rows

    assert [rows for rows in range(20) if few_rows(SimpleNamespace(is_cuda=True), rows)] == list(range(2, 17))
    assert not any(few_rows(torch.ones(rows, 4), rows) for rows in range(20))


def test_the_routed_product_keeps_every_layout(monkeypatch):
    """addmm's route (forced on the CPU) gives F.linear's product for 2-D, batched and non-contiguous
    inputs, and refuses a zero bias of another dtype, too short, or on another device."""
    from wmtp.linear import linear

    calls, plain = _routed(monkeypatch)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(12, 8, generator=g, dtype=torch.float64)
    zero = torch.zeros(16, dtype=torch.float64)
    f64 = dict(generator=g, dtype=torch.float64)
    inputs = [torch.randn(5, 8, **f64), torch.randn(2, 3, 8, **f64),
              torch.randn(8, 3, 2, **f64).transpose(0, 2)]  # (2, 3, 8), not contiguous
    for x in inputs:
        calls.clear()
        y = linear(x, w, zero)
        assert calls == [True] and y.shape == (*x.shape[:-1], 12)
        assert torch.allclose(y, plain(x, w), rtol=0, atol=1e-12)
    for bad in (torch.zeros(16), torch.zeros(11, dtype=torch.float64), torch.zeros(16, dtype=torch.float64,
                                                                                  device="meta")):
        with pytest.raises(ValueError, match="zero bias must be"):
            linear(inputs[0], w, bad)


def test_a_bad_zero_bias_is_refused_off_the_route_too():
    """The CPU's plain product adds no bias, yet a zero bias of another dtype, too short, or on
    another device is refused there as on the route: one contract, whatever path runs."""
    from wmtp.linear import linear

    x, w = torch.zeros(5, 8, dtype=torch.float64), torch.zeros(12, 8, dtype=torch.float64)
    assert linear(x, w, torch.zeros(12, dtype=torch.float64)).shape == (5, 12)
    for bad in (torch.zeros(12), torch.zeros(11, dtype=torch.float64), torch.zeros(12, dtype=torch.float64,
                                                                                  device="meta")):
        with pytest.raises(ValueError, match="^linear's zero bias must be torch.float64 on cpu with at least 12"):
            linear(x, w, bad)


def test_every_product_of_a_few_row_pass_takes_the_route(monkeypatch):
    """Module wiring: an 8-row target pass routes all 7 products of each layer and the LM head, an
    8-row head pass its projection, its block's 7 and the LM head; a one-row step none."""
    target, head = (m.double() for m in wmtp.build_models("tiny", seed=0))
    calls, _ = _routed(monkeypatch)
    ids = torch.arange(8)[None]
    target(ids, torch.arange(8), target.new_cache(1, 16))
    assert calls == [True] * (7 * target.config.n_layers + 1)
    calls.clear()
    head(torch.randn(1, 8, target.config.d_model, dtype=torch.float64), ids, torch.arange(8), head.new_cache(1, 16))
    assert calls == [True] * (1 + 7 + 1)
    calls.clear()
    target(ids[:, :1], torch.arange(1), target.new_cache(1, 16))
    assert calls == [False] * (7 * target.config.n_layers + 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the cuBLASLt route")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_linear_on_cuda_routes_few_rows_to_addmm(monkeypatch, dtype):
    """2 .. FEW_ROWS rows take a zero bias (addmm: cuBLASLt), 1 row and more than FEW_ROWS none; the
    product is F.linear's within the dtype's rounding, its shape ``(..., out)``."""
    import torch.nn.functional as F

    from wmtp.linear import FEW_ROWS, linear

    biased = []
    plain = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: biased.append(b is not None) or plain(x, w, b))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g).to("cuda", dtype)
    zero = torch.zeros(128, device="cuda", dtype=dtype)
    assert FEW_ROWS == 16
    for shape in [(1, 1, 64), (1, 2, 64), (7, 64), (2, 4, 64), (1, FEW_ROWS, 64), (1, FEW_ROWS + 1, 64)]:
        x = torch.randn(shape, generator=g).to("cuda", dtype)
        rows = x.numel() // 64
        biased.clear()
        y = linear(x, w, zero)
        assert biased == [1 < rows <= FEW_ROWS] and y.shape == (*shape[:-1], 96)
        ref = plain(x.double(), w.double())
        tol = {torch.float32: 1e-4, torch.float64: 1e-12, torch.bfloat16: 0.1, torch.float16: 0.01}[dtype]
        assert (y.double() - ref).abs().max() <= tol * ref.abs().max()


def test_the_heads_caches_take_max_len_and_the_heads_dtype_and_its_weights_a_fixed_default_seed():
    """Mutation round 3: ``MTPHead.new_cache`` ignoring ``max_len`` (every cache the preset's
    ``max_seq_len``), defaulting to float32 for a float64 head, and a changed default weight seed
    all survived every test."""
    target, head = wmtp.build_models("tiny", seed=0)
    assert target.config.max_seq_len == 2048
    full, paged = head.new_cache(2, 40), head.new_cache(2, 40, page_size=4)
    ring = head.new_cache(2, 40, ring=(4, 16, 3))
    assert full.k.shape == (1, 2, 2, 40, 16) and full.max_len == 40  # (layers, B, Hkv, S, D)
    assert paged.k.shape == (1, 2 * 10 + 2 + 1, 4, 2, 16) and paged.max_len == 40  # 10 pages a row, spares
    assert ring.k.shape == (1, 2 * (4 + 16 + 3), 1, 2, 16) and ring.max_len == 40  # a row's slots, pages of 1
    assert {c.k.dtype for c in (full, paged, ring)} == {torch.float32}
    head64 = copy.deepcopy(head).double()
    assert {c.k.dtype for c in (head64.new_cache(1, 8), head64.new_cache(1, 8, page_size=4),
                                head64.new_cache(1, 8, ring=(4, 16, 3)))} == {torch.float64}
    default = wmtp.MTPHead(MTPConfig(), target)
    seeded = wmtp.MTPHead(MTPConfig(), target, torch.Generator().manual_seed(1))  # the head's default seed
    other = wmtp.MTPHead(MTPConfig(), target, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(default.parameters(), seeded.parameters()))
    assert not torch.equal(default.proj, other.proj)


def test_the_heads_caches_take_checked_and_the_heads_device():
    """``MTPHead.new_cache`` hands ``checked`` to every kind of cache (as the target's does) and puts
    the cache on the head's device when none is given (a head on the meta device: the ring's
    construction reads values, so only the full and paged caches)."""
    target, head = wmtp.build_models("tiny", seed=0)
    for layout in ({}, {"page_size": 4}, {"ring": (4, 16, 3)}):
        assert head.new_cache(2, 40, **layout).checked and not head.new_cache(2, 40, checked=False, **layout).checked
    meta = wmtp.MTPHead(MTPConfig(), copy.deepcopy(target).to("meta")).to("meta")
    assert {meta.new_cache(1, 8).k.device.type, meta.new_cache(1, 8, page_size=4).k.device.type} == {"meta"}


def _rms(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate(x, pos, theta):
    """RoPE by hand: halves (x1, x2) turned by pos * theta^(-2i/D) (the Llama layout)."""
    D = x.shape[-1]
    angle = pos.double()[:, None] * theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (L, D/2)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], -1)


def _block_by_hand(blk, x, cfg, local):
    """One pre-norm block written out: ``x + attn(norm(x))``, then ``x + w_down(silu(w_gate h) * w_up h)``."""
    B, L, _ = x.shape
    Hq, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    a = blk.attn
    h = _rms(x, blk.attn_norm.weight, cfg.norm_eps)
    q = (h @ a.wq.T).view(B, L, Hq, D).transpose(1, 2)
    k = (h @ a.wk.T).view(B, L, Hkv, D).transpose(1, 2)
    v = (h @ a.wv.T).view(B, L, Hkv, D).transpose(1, 2)
    pos = torch.arange(L)
    if local:  # RoPE, a window of local_window keys
        q, k = _rotate(q, pos, cfg.rope_theta), _rotate(k, pos, cfg.rope_theta)
        allowed = (pos[None] <= pos[:, None]) & (pos[None] > pos[:, None] - cfg.local_window)
    else:  # NoPE, every earlier key, queries scaled by max(1, log(t + 1) / log(train_seq_len))
        q = q * (torch.log(pos.double() + 1) / math.log(cfg.train_seq_len)).clamp(min=1)[:, None]
        allowed = pos[None] <= pos[:, None]
    k, v = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)  # query head i reads KV head i // group
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~allowed, float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, Hq * D)
    x = x + y @ a.wo.T
    h = _rms(x, blk.mlp_norm.weight, cfg.norm_eps)
    m = blk.mlp
    return x + (torch.nn.functional.silu(h @ m.w_gate.T) * (h @ m.w_up.T)) @ m.w_down.T


def test_a_pass_is_the_blocks_written_out_by_hand():
    """The target's logits and hidden states against the model written out in plain tensor ops: RoPE'd
    local layers reading ``local_window`` keys, a NoPE global layer whose queries are scaled by the
    log-length past ``train_seq_len``, GQA, SwiGLU, pre-norm blocks, the tied head. Every norm weight
    is made its own (all start at ones) and the weights wide, so a swapped norm, gate/up, or a
    scaling left out moves the result far past rounding (mutation round 4: those all survived)."""
    cfg = ModelConfig(vocab_size=40, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=24, local_window=3,
                      global_layers=(1,), train_seq_len=4, rope_theta=100.0, norm_eps=0.25)
    target = wmtp.TargetLM(cfg, torch.Generator().manual_seed(0)).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in target.named_parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float64) + 0.5 if p.dim() == 1
                    else p * 25)  # norm weights in [0.5, 1.5), each its own; matrices N(0, 0.5)
    ids = torch.randint(0, 40, (2, 11), generator=g)
    x = target.embed[ids]
    with torch.no_grad():
        for i, blk in enumerate(target.layers):
            x = _block_by_hand(blk, x, cfg, local=i != 1)
        want = _rms(x, target.norm.weight, cfg.norm_eps) @ target.embed.T
        for cache in (None, target.new_cache(2, 16)):
            logits, hidden = target(ids, torch.arange(11), cache, "torch")
            torch.testing.assert_close(hidden, x, rtol=0, atol=1e-10)
            torch.testing.assert_close(logits, want, rtol=0, atol=1e-10)


def test_a_pass_without_a_cache_starts_at_position_0():
    """With no cache a pass reads only its own keys, so it must hold positions 0 ..: one that starts
    later (the rest of its context nowhere) or with a row's own positions is refused (mutation round 4:
    a pass from position 3 ran silently)."""
    target = wmtp.TargetLM(SMALL)
    ids = torch.tensor([[1, 2, 3]])
    for pos in (torch.arange(3, 6), torch.tensor([1, 2, 3]), torch.arange(3)[None]):
        with pytest.raises(ValueError, match="without a cache must start at position 0"):
            target(ids, pos)
    assert torch.equal(target(ids, torch.arange(3))[0], target(ids)[0])


def test_a_cache_of_another_type_or_batch_is_refused_by_name():
    """A string cache was an AttributeError ('str' object has no attribute 'check_reads'); a 2-row cache under
    1-row ids the write's 'k, v must be (2, ...)', which never named the cache's rows. Refused before a write."""
    target = wmtp.TargetLM(SMALL)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="cache must be None or a KV cache .* got str"):
        target(ids, cache="x")
    fake = types.SimpleNamespace(k=torch.zeros(1, 1, 1, 16, 8), batch=1)  # a cache's look, no cache
    with pytest.raises(ValueError, match="cache must be None or a KV cache .* got SimpleNamespace"):
        target(ids, cache=fake)
    for cache in (target.new_cache(2, 16), target.new_cache(2, 16, page_size=4)):
        with pytest.raises(ValueError, match="the cache holds 2 rows and ids 1"):
            target(ids, cache=cache)
        assert not cache.k.any()
    with pytest.raises(ValueError, match="the cache holds 1 rows and ids 2"):
        target(ids.repeat(2, 1), cache=target.new_cache(1, 16))
    assert torch.equal(target(ids, cache=target.new_cache(1, 16))[0], target(ids)[0])


@pytest.mark.parametrize("ids, pos, match", [  # IndexError, RuntimeError or AttributeError from inside torch before
    (torch.tensor([[1, 64]]), None, r"token ids must lie in \[0, 64\)"),
    (torch.tensor([[-1, 2]]), None, r"token ids must lie in \[0, 64\)"),
    (torch.tensor([1, 2]), None, r"ids must be a \(B, L\) int32 or int64 tensor .* got \(2,\) torch.int64"),
    (torch.tensor([[1.0, 2.0]]), None, r"got \(1, 2\) torch.float32"),
    (torch.zeros(1, 0, dtype=torch.long), None, r"with L >= 1 .* got \(1, 0\)"),
    ([[1, 2]], None, "got list$"),
    (torch.tensor([[1, 2]]), [0, 1], "pos must be a tensor of positions or None, got list"),
])
def test_a_pass_refuses_bad_ids(ids, pos, match):
    with pytest.raises(ValueError, match=match):
        wmtp.TargetLM(SMALL)(ids, pos)


def test_weights_start_at_the_stated_spreads():
    """``init_weights``: every matrix N(0, 0.02), the output projections (``wo``, ``w_down``) N(0, 0.02 /
    sqrt(2 n_layers)), every norm weight 1 (mutation round 4: each spread could change unseen). The tiny
    preset has 2 layers: 0.01 for its output projections; the head counts as 1 layer: 0.02 / sqrt(2)."""
    target, head = wmtp.build_models("tiny", seed=0)
    spreads = {}
    for prefix, model in (("", target), ("head.", head)):
        for name, p in model.named_parameters():
            if p.dim() == 1:
                assert torch.equal(p, torch.ones_like(p)), name
            else:
                spreads[prefix + name] = p.std().item()
    want = {"embed": 0.02, "layers.0.attn.wq": 0.02, "layers.1.attn.wk": 0.02, "layers.0.attn.wo": 0.01,
            "layers.1.attn.wo": 0.01, "layers.0.mlp.w_up": 0.02, "layers.1.mlp.w_gate": 0.02,
            "layers.1.mlp.w_down": 0.01, "head.proj": 0.02, "head.block.attn.wv": 0.02,
            "head.block.attn.wo": 0.02 / math.sqrt(2), "head.block.mlp.w_down": 0.02 / math.sqrt(2)}
    for name, std in want.items():  # 2048 or more draws each (seed 0): the sample spread within 5 %
        assert spreads[name] == pytest.approx(std, rel=0.05), name


def test_the_targets_caches_take_their_arguments_and_its_weights_a_fixed_default_seed():
    """``TargetLM.new_cache`` (mutation round 4, as round 3 found for the head's): ``max_len`` (not the
    preset's 2048), ``checked``, the target's dtype; ``TargetLM(config)`` draws from seed 0."""
    target, head = wmtp.build_models("tiny", seed=0)
    full, paged = target.new_cache(2, 40), target.new_cache(2, 40, page_size=4)
    assert full.k.shape == (2, 2, 2, 40, 16) and full.max_len == 40  # (layers, B, Hkv, S, D)
    assert paged.max_len == 40 and full.k.dtype == paged.k.dtype == torch.float32
    assert full.checked and not target.new_cache(2, 40, checked=False).checked
    assert not target.new_cache(2, 40, page_size=4, checked=False).checked
    assert copy.deepcopy(target).double().new_cache(1, 8).k.dtype == torch.float64
    for make in (target.new_cache, head.new_cache):  # 0 was read as "the preset's 2048", silently
        with pytest.raises(ValueError, match="max_len must be an integer >= 1, got 0"):
            make(1, 0)
        with pytest.raises(ValueError, match="max_len must be an integer >= 1, got -1"):  # torch's RuntimeError
            make(1, -1)
        with pytest.raises(ValueError, match="max_len must be an integer >= 1, got 8.0"):  # a TypeError
            make(1, 8.0)
        with pytest.raises(ValueError, match="batch must be an integer >= 1, got 0"):  # a cache of no rows
            make(0, 8)
    default = wmtp.TargetLM(target.config)
    seeded = wmtp.TargetLM(target.config, torch.Generator().manual_seed(0))
    other = wmtp.TargetLM(target.config, torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(default.parameters(), seeded.parameters()))
    assert not torch.equal(default.embed, other.embed)
