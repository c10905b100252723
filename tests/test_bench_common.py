"""What the benches share (wmtp/bench_common.py) and the plain attention timing (wmtp/bench.py), on
literal inputs and fake clocks: the prompt a context, the metrics header, the per-context driver and
its partial writes, the options a bench checks, the final JSON at its default path (the preset's
name in it but for the default preset's); ``time_call``'s warm-up and repeats,
``bench_draft_attention``'s medians and ratio against the native key set, ``wmtp bench attention``
off CUDA and its check that k and v fit the device. No model decodes and nothing is timed
(tests/test_cli_bench_*.py run the benches)."""

import argparse
import copy
import dataclasses
import io
import json
import types

import pytest
import torch
from rich.console import Console

import wmtp
from wmtp import bench, bench_common
from wmtp.cli import main
from wmtp.config import KeySetConfig, get_preset

NATIVE, WIN = KeySetConfig(0, None), KeySetConfig(4, 16)
TOKENS = {"train": torch.arange(0, 5), "valid": torch.arange(5, 8), "test": torch.arange(8, 10)}


def test_long_prompt_is_the_last_tokens_of_the_splits_end_to_end():
    assert bench_common.long_prompt(TOKENS, 4).tolist() == [6, 7, 8, 9]
    assert bench_common.long_prompt(TOKENS, 10).tolist() == list(range(10))  # every token is enough
    with pytest.raises(ValueError, match="^the corpus has 10 tokens; context 11 needs more: pass --contexts of at "
                                         "most 10 tokens$"):  # the flag that helps, and how far
        bench_common.long_prompt(TOKENS, 11)


def test_bench_setup_header_holds_the_preset_given(monkeypatch):
    """The header's config is the preset as the bench runs it (``--new-tokens`` applied), the KV
    capacity the longest context's; the checkpoint's fields without its loss curves."""
    target, head = wmtp.build_models("tiny", seed=0)
    corpus = types.SimpleNamespace(name="c", message="a stub corpus", fingerprint="f0")
    monkeypatch.setattr("wmtp.data.load_corpus", lambda *a, **k: corpus)
    monkeypatch.setattr("wmtp.tokenizer.train_tokenizer", lambda *a: None)
    monkeypatch.setattr("wmtp.tokenizer.corpus_token_splits", lambda corpus, tok: TOKENS)
    info = {"checkpoint": "x.pt", "trained": False, "target_losses": [3.0], "head_losses": [2.0]}
    monkeypatch.setattr("wmtp.reproduce.prepare_models", lambda *a: (target, head, info))
    p = get_preset("tiny")
    preset = dataclasses.replace(p, spec=dataclasses.replace(p.spec, new_tokens=5))
    setup = bench_common.bench_setup("bench-x", preset, None, torch.device("cpu"), 7, (4, 8), "cache", "wmtp bench x",
                                     False, lambda line: None)
    assert {c: x.tolist() for c, x in setup.prompts.items()} == {4: [6, 7, 8, 9], 8: list(range(2, 10))}
    assert setup.text.tolist() == list(range(10))
    h = setup.header
    assert (h["kind"], h["command"], h["seed"], h["decode_dtype"]) == ("bench-x", "wmtp bench x", 7, "float64")
    assert h["corpus"] == {"name": "c", "fingerprint": "f0", "tokens": {"train": 5, "valid": 3, "test": 2}}
    assert h["checkpoint"] == {"checkpoint": "x.pt", "trained": False}
    assert h["config"]["spec"] == dataclasses.asdict(preset.spec) and h["config"]["spec"]["new_tokens"] == 5
    assert h["config"]["kv_capacity"] == 8 + 5 + 3 == setup.target.config.max_seq_len  # + new tokens + depth
    assert setup.target.embed.dtype == setup.head.proj.dtype == torch.float64


def test_run_contexts_keeps_each_row_with_its_prefill_and_hands_it_on(monkeypatch):
    """One prefill a context (its seconds beside every row of it); the metrics so far after every row,
    incomplete until the last."""
    prefills = []

    def timed_prefill(target, head, prompt, preset, page_size):
        prefills.append((prompt.numel(), page_size))
        return f"pre{prompt.numel()}", 0.25 * prompt.numel()

    monkeypatch.setattr(bench_common, "timed_prefill", timed_prefill)
    setup = bench_common.BenchSetup(None, None, {4: torch.zeros(4), 8: torch.zeros(8)}, {}, None)

    def rows(prompt, pre, tick):
        for i in range(2):
            tick(f"row {i}")
            yield {"context": prompt.numel(), "pre": pre, "i": i, "loop": ("eager", "graph")[i]}

    partials, lines = [], []
    result = bench_common.run_contexts("t", setup, get_preset("tiny"), "cpu", (8, 4), 2, rows, {"rows": []}, 0.0,
                                       False, lines.append, lambda r: partials.append(copy.deepcopy(r)), 16)
    want = [{"context": c, "pre": f"pre{c}", "i": i, "loop": ("eager", "graph")[i], "prefill_s": c / 4}
            for c in (8, 4) for i in range(2)]
    assert prefills == [(8, 16), (4, 16)] and result["rows"] == want and result["complete"] is True
    # each row said by what sets it apart in its context, not "row 3 done" (row of what?)
    assert [line for line in lines if "prefilled" not in line] == [
        "context 8, eager loop: done (row 1 of the JSON)", "context 8, graph loop: done (row 2 of the JSON)",
        "context 4, eager loop: done (row 3 of the JSON)", "context 4, graph loop: done (row 4 of the JSON)"]
    assert bench_common.row_name({"temperature": 0.7}) == ", temperature 0.7"  # sampling's, positions' rows
    assert bench_common.row_name({"context": 8}) == ""
    assert [p["rows"] for p in partials] == [want[:n] for n in range(1, 5)]
    assert all("complete" not in p and p["wall_time_s"] > 0 for p in partials)


def _model_args(**kw):
    return argparse.Namespace(**{"device": "cpu", "contexts": [64], "new_tokens": None, "preset": "tiny",
                                 "keysets": None, **kw})


def test_model_options_apply_new_tokens_and_keysets_native_first():
    device, preset, slug = bench_common.model_options(_model_args(new_tokens=2, keysets=["8:64", "4:16@100"]))
    assert (device.type, slug, preset.spec.new_tokens) == ("cpu", "cpu", 2)
    assert preset.spec.keysets == (NATIVE, KeySetConfig(8, 64), KeySetConfig(4, 16, gate=100))
    assert bench_common.model_options(_model_args())[1] == get_preset("tiny")
    for bad, message in ((dict(new_tokens=1), "--new-tokens must be at least 2, got 1"),  # the one flag wrong
                         (dict(contexts=[64, 1]), "--contexts must be at least 2, got 64 1")):
        with pytest.raises(ValueError, match=f"^{message}$"):
            bench_common.model_options(_model_args(**bad))


def test_bench_cli_writes_the_final_json_at_its_default_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(contexts=[64, 128], out=None, cache_dir=tmp_path / "cache", preset="small")
    final = {"rows": [1, 2], "complete": True, "wall_time_s": 3.0}

    def run(command, log, on_context):
        assert command == "wmtp bench decode --contexts 64 128"
        on_context({"rows": [1], "complete": False})
        return final

    code = bench_common.bench_cli(args, "wmtp", ["bench", "decode", "--contexts", "64", "128"], "decode", "cpu", run,
                                  lambda r: f"table of {len(r['rows'])} rows")
    out, err = capsys.readouterr()
    assert code == 0 and json.loads((tmp_path / "metrics" / "bench-decode-cpu.json").read_text()) == final
    assert "table of 2 rows" in out and "wrote metrics/bench-decode-cpu.json in 3 s" in err


def test_default_out_names_the_committed_files_only_for_the_default_preset():
    """The committed results' names (metrics/bench-*-<device>.json, made with the small preset) are the
    default preset's only: a ``--preset tiny`` smoke run, even stopped after its first partial write,
    leaves them alone."""
    for name, slug in (("depth", "cpu"), ("positions", "cpu"), ("sampling", "cpu"), ("decode", "h200"),
                       ("batch", "h200")):
        committed = f"metrics/bench-{name}-{slug}.json"
        assert str(bench_common.default_out(name, "small", slug)) == committed
        assert str(bench_common.default_out(name, "tiny", slug)) == f"metrics/bench-{name}-tiny-{slug}.json"


def test_bench_cli_with_another_preset_leaves_the_committed_name_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(contexts=[64], out=None, cache_dir=tmp_path / "cache", preset="tiny")

    def run(command, log, on_context):
        on_context({"rows": [1], "complete": False})  # a partial write, as after a bench's first row
        return {"rows": [1], "complete": True, "wall_time_s": 1.0}

    assert bench_common.bench_cli(args, "wmtp", ["bench", "depth"], "depth", "cpu", run, lambda r: "") == 0
    assert sorted(p.name for p in (tmp_path / "metrics").iterdir()) == ["bench-depth-tiny-cpu.json"]


def test_time_call_warms_up_then_times_each_repeat_between_synchronizes(monkeypatch):
    clock, events = iter([0.0, 1.0, 10.0, 12.0, 20.0, 23.0]), []
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: events.append("t") or next(clock)))
    monkeypatch.setattr(bench, "synchronize", lambda device: events.append("sync"))
    assert bench.time_call(lambda: events.append("fn"), torch.device("cpu"), 3, warmup=2) == [1.0, 2.0, 3.0]
    assert events == ["fn"] * 2 + ["sync", "t", "fn", "sync", "t"] * 3  # a device's queued work waited for


def test_draft_attention_rows_take_medians_against_the_native_key_set(monkeypatch):
    """Listed windowed first, the native key set is still timed first: the baseline of the ratio."""
    times = iter([[1.0, 2.0, 6.0], [0.5, 0.5, 2.0]])  # medians 2 and 0.5 (means 3 and 1)
    monkeypatch.setattr(bench, "time_call", lambda fn, device, repeats: next(times))
    rows = bench.bench_draft_attention(get_preset("tiny").model, (64,), (WIN, NATIVE), repeats=3)
    assert [(r["keyset"], r["keys_read"], r["median_s"], r["times_s"], r["time_ratio_vs_native"]) for r in rows] == [
        ("native", 64, 2.0, [1.0, 2.0, 6.0], 1.0), ("sink4+win16", 20, 0.5, [0.5, 0.5, 2.0], 4.0)]
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(bench.attention_table(rows))
    cells = [[c.strip() for c in line.split("│")] for line in console.export_text().splitlines()]
    assert [c[-2] for c in cells if "native" in c or "sink4+win16" in c] == ["-", "4.0x"]


def test_attention_off_cuda_times_the_repeats_asked_and_refuses_the_sweeps_options(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(bench, "bench_draft_attention", lambda model, contexts, keysets, **kw: seen.append(
        (contexts, keysets, kw)) or [])
    assert main(["bench", "attention", "--device", "cpu", "--preset", "tiny", "--contexts", "64", "--repeats",
                 "2"]) == 0
    assert seen == [((64,), (NATIVE, WIN), {"repeats": 2, "dtype": torch.float32, "device": torch.device("cpu")})]
    for argv, match in ((["--rep-ms", "0"], "--repeats, --rep-ms, --batch and --contexts must be positive"),
                        (["--batch", "0"], "--repeats, --rep-ms, --batch and --contexts must be positive"),
                        (["--methods", "sdpa_full"], "--plot, --methods, --rep-ms and --batch belong to the kernel"),
                        (["--batch", "2"], "--plot, --methods, --rep-ms and --batch belong to the kernel sweep")):
        assert main(["bench", "attention", "--device", "cpu", *argv]) == 2
        assert match in capsys.readouterr().err


GIB = 2**30


def test_check_kv_fits_counts_k_v_and_their_paged_copies_of_the_largest_cell():
    # the small preset's draft shapes (Hkv 4, D 64) in fp32 at 10**8 keys: 2 x 4 x 64 x 4 bytes a key
    with pytest.raises(ValueError, match=r"^--contexts 100000000 needs about 190\.7 GiB for k and v, more than the "
                                         r"16\.0 GiB this device has$"):
        bench.check_kv_fits((1024, 10**8), 1, ((4, 64),), 4, False, 16 * GIB)
    need = 4 * 4 * 2**20 * (8 * 128) * 2  # batch 4, 1M keys, the larger (Hkv, D) of two, bf16, paged: 32 GiB
    bench.check_kv_fits((16384, 2**20), 4, ((2, 256), (8, 128)), 2, True, need)  # exactly enough
    with pytest.raises(ValueError, match=r"^--contexts 1048576 at --batch 4 needs about 32\.0 GiB for k and v and "
                                         r"their paged copies, more than the 32\.0 GiB"):
        bench.check_kv_fits((16384, 2**20), 4, ((2, 256), (8, 128)), 2, True, need - 1)
    bench.check_kv_fits((16384, 2**20), 4, ((2, 256), (8, 128)), 2, False, need // 2)  # no paged copies: half
    bench.check_kv_fits((10**12,), 1, ((4, 64),), 4, False, None)  # the device's memory unknown: not checked


def test_attention_off_cuda_refuses_contexts_the_memory_cannot_hold_before_any_work(monkeypatch, capsys, tmp_path):
    """It allocated k and v of 10**8 keys (190.7 GiB) and was killed for memory: exit 137, no message."""
    monkeypatch.setattr(bench, "device_memory_bytes", lambda device: 16 * GIB)
    monkeypatch.setattr(bench, "bench_draft_attention", lambda *a, **k: pytest.fail("the bench started"))
    out = tmp_path / "a.json"
    assert main(["bench", "attention", "--device", "cpu", "--contexts", "1024", "100000000", "--out", str(out)]) == 2
    _, err = capsys.readouterr()
    assert err.splitlines() == ["wmtp bench attention: error: --contexts 100000000 needs about 190.7 GiB for k and v, "
                                "more than the 16.0 GiB this device has"]
    assert not out.exists()


def test_device_memory_bytes_of_the_cpu_is_its_physical_memory():
    assert bench.device_memory_bytes(torch.device("cpu")) > 0


def test_check_kv_fits_takes_the_largest_context_and_shape_wherever_they_stand():
    # largest first, as --contexts may give them; (4, 64) before (1, 64): 190.7 GiB, not 1024's or (1, 64)'s
    with pytest.raises(ValueError, match=r"^--contexts 100000000 needs about 190\.7 GiB for k and v, more than"):
        bench.check_kv_fits((10**8, 1024), 1, ((4, 64), (1, 64)), 4, False, 16 * GIB)


def test_device_memory_bytes_is_a_gpus_total_else_the_hosts_physical_memory(monkeypatch):
    """A GPU's total memory, not what is free now (mem_get_info is (free, total)); off CUDA (the CPU,
    and MPS, which shares it) the host's physical pages, not the available ones; None where the OS
    does not say."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 * GIB, 80 * GIB))
    assert bench.device_memory_bytes(torch.device("cuda", 0)) == 80 * GIB
    sysconf = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1000, "SC_AVPHYS_PAGES": 10}
    monkeypatch.setattr(bench.os, "sysconf", lambda name: sysconf[name])
    assert bench.device_memory_bytes(torch.device("cpu")) == 4096 * 1000
    assert bench.device_memory_bytes(torch.device("mps")) == 4096 * 1000

    def unknown(name):
        raise ValueError("unrecognized configuration name")

    monkeypatch.setattr(bench.os, "sysconf", unknown)
    assert bench.device_memory_bytes(torch.device("cpu")) is None
    monkeypatch.delattr(bench.os, "sysconf")  # Windows has none
    assert bench.device_memory_bytes(torch.device("cpu")) is None


@pytest.mark.parametrize("name", ["batch", "decode", "depth", "positions", "sampling"])
def test_each_bench_states_its_own_default_out_and_the_default_preset(name):
    """--out's help names this bench's files (default_out's names) and --preset defaults to DEFAULT_PRESET."""
    import importlib

    from wmtp.cli import DEFAULT_PRESET

    p = argparse.ArgumentParser(formatter_class=lambda prog: argparse.HelpFormatter(prog, width=10**4))
    importlib.import_module(f"wmtp.bench_{name}").add_arguments(p)
    assert DEFAULT_PRESET == "small" and p.parse_args([]).preset == "small" and p.parse_args([]).out is None
    text = p.format_help()
    assert (f"(default: metrics/bench-{name}-<h200|cuda|cpu|mps>.json; another --preset than small goes into the "
            f"name: metrics/bench-{name}-<preset>-<h200|cuda|cpu|mps>.json)") in text
    assert "named preset (default: small, reproduce's models; another goes into --out's default name)" in text
