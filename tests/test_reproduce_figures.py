"""What ``wmtp reproduce`` computes for its metrics JSON (wmtp/reproduce.py, wmtp/metrics.py): the
draft-attention bar (judged on the CPU only), the speedup, reduction and TPOT formulas, and
``run_arms``' warm-up off the CPU and its every figure from scripted step times, with decoding
stubbed out."""

import dataclasses

import pytest
import torch

from wmtp.config import KeySetConfig


def test_draft_attention_bar_is_judged_on_cpu_only():
    """The reproduction's draft-attention bar reads its own row and is not judged off the CPU."""
    from wmtp.reproduce import draft_attention_bar

    rows = [{"context": 16384, "n_sink": 0, "window": None, "keys_read": 16384, "time_ratio_vs_native": 1.0},
            {"context": 16384, "n_sink": 8, "window": 64, "gate": 32768, "keys_read": 16384,
             "time_ratio_vs_native": 1.0},  # gated past this context: the native key set, not the bar's
            {"context": 16384, "n_sink": 8, "window": 64, "gate": None, "keys_read": 72, "time_ratio_vs_native": 20.0},
            {"context": 4096, "n_sink": 8, "window": 64, "keys_read": 72, "time_ratio_vs_native": 2.0}]
    bar = draft_attention_bar(rows, torch.device("cpu"))
    assert (bar["met"], bar["ratio"], bar["keys_read"], bar["judged_on"]) == (True, 20.0, 72, "cpu")
    rows[2]["time_ratio_vs_native"] = 14.9
    assert draft_attention_bar(rows, torch.device("cpu"))["met"] is False
    rows[2]["time_ratio_vs_native"] = 15.0  # min_ratio itself meets it (mutation round 5: > survived)
    assert draft_attention_bar(rows, torch.device("cpu"))["met"] is True
    assert draft_attention_bar(rows, torch.device("cuda"))["met"] is None  # no device needed: the type decides
    assert draft_attention_bar(rows[3:], torch.device("cpu")) is None
    assert draft_attention_bar(rows[:2], torch.device("cpu")) is None  # only the gated row at 16384


def test_speedup_reduction_and_tpot_are_the_stated_formulas():
    """The metrics JSON's figures (wmtp/metrics.py, DESIGN.md "Measuring"): a speedup is old/new - 1,
    a reduction 1 - new/old, TPOT (t_verify + t_draft) / AL, and an AL that is not positive a ValueError."""
    from wmtp.metrics import reduction, speedup, tpot

    assert speedup(3.0, 2.0) == 0.5 and speedup(2.0, 4.0) == -0.5  # 3 s -> 2 s: 50% faster
    assert reduction(4.0, 3.0) == 0.25 and reduction(2.0, 3.0) == -0.5  # a cost of 4 -> 3: 25% less
    assert tpot(3.0, 1.0, 2.0) == 2.0  # a 4 s step keeping 2 tokens
    for al in (0, -1.0):
        with pytest.raises(ValueError, match="mean accept length must be positive"):
            tpot(1.0, 1.0, al)


@pytest.mark.parametrize("device, warmed", [("cpu", False), ("meta", True)])
def test_run_arms_warms_up_off_the_cpu_only(monkeypatch, device, warmed):
    """Off the CPU every run is made once untimed first (Triton compiles on first calls); on the
    CPU, where nothing compiles, never. Decoding is stubbed: this counts calls, on any device."""
    import wmtp.reproduce as rep
    from wmtp.config import get_preset
    from wmtp.stats import SpecStats

    calls = {"untimed": 0}

    def greedy(target, prompt, n, step_times=None):
        calls["untimed"] += step_times is None
        if step_times is not None:
            step_times.extend([1e-3] * (n - 1))
        return torch.zeros(n, dtype=torch.long)

    gates = []

    def speculative(target, head, prompt, n, depth, n_sink, window, gate):
        calls["untimed"] += 1  # the timed runs are counted too, and subtracted below
        gates.append(gate)
        stats = SpecStats(depth, proposed=depth, steps=1, committed=n, draft_times_s=[1e-3], verify_times_s=[1e-3])
        return torch.zeros(n, dtype=torch.long), stats

    monkeypatch.setattr(rep, "greedy_generate", greedy)
    monkeypatch.setattr(rep, "speculative_generate", speculative)
    preset = get_preset("tiny")  # two key sets: native and one window; and one gated
    preset = dataclasses.replace(preset, spec=dataclasses.replace(
        preset.spec, keysets=(*preset.spec.keysets, KeySetConfig(4, 16, gate=20))))
    row = rep.run_arms(None, None, torch.zeros(8, dtype=torch.long, device=device), preset)
    untimed = 1 + len(preset.spec.keysets) if warmed else 0  # dense + each arm, once, off the CPU
    assert calls["untimed"] - len(preset.spec.keysets) == untimed
    assert set(row["arms"]) == {ks.label for ks in preset.spec.keysets}
    assert gates[-3:] == [None, None, 20] and row["arms"]["sink4+win16+gate20"]["gate"] == 20


def test_run_arms_figures_from_scripted_times(monkeypatch):
    """Every figure of an arm, from scripted step times worked out by hand (decoding stubbed; mutation
    round 4: each formula below could change unseen). Dense: steps of 1, 2 and 6 s, median 2. Native
    (run first, though listed last): draft 2, 4, 12 and verify 10, 6, 2: medians 4 and 6, step median
    of the sums 12, 10, 14: 12; 6 tokens in 3 steps, AL 2: TPOT (6 + 4) / 2 = 5, speedup 2 / 5 - 1.
    sink4+win16: draft 1 each, verify 6 each, AL 9 / 3 = 3: TPOT 7 / 3, draft 1 - 1/4 = 75 % less
    than native's. An arm whose tokens are not dense's is an AssertionError, never a row."""
    import wmtp.reproduce as rep
    from wmtp.config import get_preset
    from wmtp.stats import SpecStats

    def greedy(target, prompt, n, step_times=None):
        step_times.extend([1.0, 6.0, 2.0])
        return torch.zeros(n, dtype=torch.long)

    script = {None: ([2.0, 4.0, 12.0], [10.0, 6.0, 2.0], 6, 30), 16: ([1.0] * 3, [6.0] * 3, 9, 24)}
    wrong = []

    def speculative(target, head, prompt, n, depth, n_sink, window, gate):
        draft, verify, committed, keys = script[window]
        stats = SpecStats(depth, proposed=3 * depth, accepted=3, steps=3, committed=committed, draft_keys_read=keys,
                          draft_times_s=draft, verify_times_s=verify)
        return torch.full((n,), int(window in wrong), dtype=torch.long), stats

    monkeypatch.setattr(rep, "greedy_generate", greedy)
    monkeypatch.setattr(rep, "speculative_generate", speculative)
    preset = get_preset("tiny")
    preset = dataclasses.replace(preset, spec=dataclasses.replace(preset.spec, keysets=preset.spec.keysets[::-1]))
    row = rep.run_arms(None, None, torch.zeros(8, dtype=torch.long), preset)
    assert row["dense"] == {"step_median_s": 2.0, "tpot_s": 2.0} and list(row["arms"]) == ["native", "sink4+win16"]
    native, win = row["arms"]["native"], row["arms"]["sink4+win16"]
    assert (native["draft_time_per_step_s"], native["verify_time_per_step_s"], native["step_median_s"]) == (4, 6, 12)
    assert native["tpot_s"] == 5 and native["draft_keys_read_per_step"] == 10
    assert native["draft_time_reduction_vs_native"] == 0
    assert native["tpot_speedup_vs_dense"] == pytest.approx(-0.6) and native["lossless"] is True
    assert (win["draft_time_per_step_s"], win["verify_time_per_step_s"], win["step_median_s"]) == (1, 6, 7)
    assert win["tpot_s"] == pytest.approx(7 / 3) and win["tpot_speedup_vs_dense"] == pytest.approx(6 / 7 - 1)
    assert (win["draft_keys_read_per_step"], win["draft_time_reduction_vs_native"]) == (8, 0.75)
    wrong.append(16)
    with pytest.raises(AssertionError, match=r"arm sink4\+win16 at context 8 is not lossless"):
        rep.run_arms(None, None, torch.zeros(8, dtype=torch.long), preset)


def test_a_reproduction_of_no_training_steps_records_no_final_loss(wikitext_dir, tmp_path, monkeypatch):
    """TrainConfig takes 0 steps (an untrained model's reproduction); the JSON's final losses are then
    None, where taking the last of no losses raised an IndexError after every arm had decoded. The run
    reads the corpus capped at the preset's ``max_train_chars``, scores perplexity and the head on the
    valid split (the head's windows drawn from the seed), decodes the CPU arms in float64 and records
    the preset's configs, each under its own name (a session 54 audit: the test split, seed 0, float32
    models, an uncapped corpus and the head's config under "train" each passed every test)."""
    from dataclasses import asdict

    from wmtp import data, tokenizer
    from wmtp import reproduce as rep
    from wmtp.config import get_preset

    p = get_preset("tiny")
    p = dataclasses.replace(p, train=dataclasses.replace(p.train, target_steps=0, head_steps=0))
    seen = {}

    def spy(name, real, record):
        def call(*a, **k):
            out = real(*a, **k)
            seen.setdefault(name, []).append(record(a, k, out))
            return out
        return call

    monkeypatch.setattr(data, "load_corpus", spy("corpus", data.load_corpus, lambda a, k, out: k))
    monkeypatch.setattr(tokenizer, "corpus_token_splits", spy("splits", tokenizer.corpus_token_splits,
                                                              lambda a, k, out: out))
    monkeypatch.setattr(rep, "perplexity", spy("ppl", rep.perplexity, lambda a, k, out: a[1]))
    monkeypatch.setattr(rep, "head_accuracy", spy("acc", rep.head_accuracy,
                                                  lambda a, k, out: (a[2], a[6].initial_seed())))
    monkeypatch.setattr(rep, "run_arms", spy("arms", rep.run_arms, lambda a, k, out: (a[0].embed.dtype,
                                                                                      a[1].proj.dtype)))
    m = rep.reproduce(p, str(wikitext_dir), torch.device("cpu"), 5, None, tmp_path, None, "test", progress=False,
                      log=lambda *a: None)
    assert (m["training"]["target_losses"], m["training"]["head_losses"]) == (None, None)
    assert all(arm["lossless"] for ctx in m["contexts"] for arm in ctx["arms"].values())
    assert seen["corpus"] == [{"max_chars": p.train.max_train_chars}]
    valid = seen["splits"][0]["valid"]
    assert len(seen["ppl"]) == len(p.spec.ppl_contexts) and all(t is valid for t in seen["ppl"])
    assert seen["acc"] == [(valid, 5)]
    assert seen["arms"] == [(torch.float64, torch.float64)] * len(p.spec.contexts) and m["decode_dtype"] == "float64"
    assert m["config"] == {"preset": "tiny", "model": asdict(p.model), "mtp": asdict(p.mtp), "train": asdict(p.train),
                           "spec": asdict(p.spec)}
