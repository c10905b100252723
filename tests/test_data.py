"""Tests of wmtp.data: WikiText-2 layouts and the offline fallbacks (the tokenizer: tests/test_tokenizer.py)."""

import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported: never reach for the hub

import contextlib
import hashlib
import logging
import random
import re
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import datasets
import pytest

from wmtp import data

ROOT = Path(__file__).resolve().parents[1]
SHARED_WIKITEXT = [p / "shared/data/wikitext-2" for p in (ROOT, ROOT.parent)]
EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test"}


def wikitext_lines(seed: int, n_articles: int = 6) -> list[str]:
    """A few hundred lines in WikiText's format: ` = Title = `, ` = = Section = = `, `<unk>`..."""
    rng = random.Random(seed)
    words = ["the", "lobster", "<unk>", "@-@", ",", ".", "1993", "species", "café", "(", ")"]
    lines = []
    for article in range(n_articles):
        lines += [" ", f" = Article {seed}-{article} = ", " "]
        for section in range(4):
            lines += [f" = = Section {section} = = ", " "]
            for _ in range(5):
                sentence = " ".join(rng.choice(words) for _ in range(rng.randint(5, 40)))
                lines += [f" {sentence} ", " "]
    return lines


def write_text_split(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_parquet_split(path: Path, lines: list[str]) -> None:
    """Rows as the hub stores them: a blank line is "", any other line keeps its "\\n"."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["" if not line.strip() else line + "\n" for line in lines]
    datasets.Dataset.from_dict({"text": rows}).to_parquet(str(path))


SPLIT_LINES = {split: wikitext_lines(seed) for seed, split in enumerate(data.SPLITS)}

# (file of each split relative to the dataset dir, writer); {} is the split's name in that layout
LAYOUTS = {
    "tokens": ("wiki.{}.tokens", write_text_split),
    "raw": ("wiki.{}.raw", write_text_split),
    "txt": ("{}.txt", write_text_split),
    "txt-in-subdir": ("wikitext-2/{}.txt", write_text_split),
    "hub-parquet": ("wikitext-2-raw-v1/{}-00000-of-00001.parquet", write_parquet_split),
}


def hub_split_name(layout: str, split: str) -> str:
    return "validation" if split == "valid" and layout == "hub-parquet" else split


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_wikitext_layout_loads_every_split(tmp_path, layout):
    pattern, write = LAYOUTS[layout]
    for split, lines in SPLIT_LINES.items():
        write(tmp_path / pattern.format(hub_split_name(layout, split)), lines)
    before = sorted(tmp_path.rglob("*"))
    corpus = data.load_corpus(tmp_path)
    assert corpus.name == "wikitext-2"
    for split, lines in SPLIT_LINES.items():
        loaded = getattr(corpus, split).split("\n")
        if layout == "hub-parquet":  # the hub stores a blank line as ""
            lines = [line if line.strip() else "" for line in lines]
        assert loaded == lines, split
    assert "loaded WikiText-2 from" in corpus.message
    assert sorted(tmp_path.rglob("*")) == before  # nothing cached into the dataset dir


def test_raw_preferred_and_wikitext_103_ignored(tmp_path):
    """The layout of the original zips: wikitext-2/ (tokenized) beside wikitext-2-raw/."""
    for split, lines in SPLIT_LINES.items():
        write_text_split(tmp_path / f"wikitext-103-raw/wiki.{split}.raw", ["103"])
        write_text_split(tmp_path / f"wikitext-2/wiki.{split}.tokens", ["tokens"])
        write_text_split(tmp_path / f"wikitext-2-raw/wiki.{split}.raw", lines)
    corpus = data.load_corpus(tmp_path)
    assert corpus.source == str(tmp_path / "wikitext-2-raw")
    assert corpus.train.split("\n") == SPLIT_LINES["train"]


def shared_wikitext_dir() -> Path:
    for candidate in SHARED_WIKITEXT:
        if (candidate / "valid.txt").is_file():
            return candidate
    pytest.skip(f"shared WikiText-2 valid/test files absent (looked in {SHARED_WIKITEXT})")


def test_shared_wikitext_without_train_split_trains_on_valid():
    folder = shared_wikitext_dir()
    corpus = data.load_corpus(folder)
    assert corpus.name == "wikitext-2"
    assert corpus.message == (
        f"WikiText-2 in {folder} has no train split: training on its valid split, evaluating on "
        "its test split (first half valid, second half test)")
    valid_txt = (folder / "valid.txt").read_text(encoding="utf-8")
    test_lines = (folder / "test.txt").read_text(encoding="utf-8").removesuffix("\n").split("\n")
    assert corpus.train == valid_txt.removesuffix("\n")
    assert len(corpus.train.split("\n")) == 3760  # as wc -l and the shared README say
    assert len(test_lines) == 4358
    assert corpus.valid.split("\n") == test_lines[:2179]
    assert corpus.test.split("\n") == test_lines[2179:]


def test_missing_dir_raises_with_its_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError, match=f"dataset dir '{re.escape(str(missing))}' does not exist"):
        data.load_corpus(missing)


def test_empty_dir_raises(tmp_path):
    with pytest.raises(ValueError, match="is empty"):
        data.load_corpus(tmp_path)


def test_file_instead_of_dir_raises(tmp_path):
    (tmp_path / "wiki.train.raw").write_text("x\n")
    with pytest.raises(ValueError, match="is not a directory"):
        data.load_corpus(tmp_path / "wiki.train.raw")


@pytest.mark.parametrize("content", ["", " \n\n \n"])
def test_empty_split_file_raises_naming_it(tmp_path, content):
    write_text_split(tmp_path / "valid.txt", SPLIT_LINES["valid"])
    write_text_split(tmp_path / "test.txt", SPLIT_LINES["test"])
    (tmp_path / "train.txt").write_text(content)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "train.txt"))):
        data.load_corpus(tmp_path)


def test_unreadable_split_file_raises_naming_it(tmp_path):
    write_text_split(tmp_path / "valid.txt", SPLIT_LINES["valid"])
    (tmp_path / "test.txt").write_bytes(b"ok line\n\xff\xfe not utf-8\n")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "test.txt"))):
        data.load_corpus(tmp_path)


def test_broken_parquet_raises_one_error_and_logs_nothing(tmp_path):
    for split in ("validation", "test"):  # shorter than parquet's footer
        (tmp_path / f"{split}-00000-of-00001.parquet").write_bytes(b"garbage")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("datasets")  # datasets' own handler writes to a stderr of its import time
    logger.addHandler(handler)
    hf_logging = data._datasets().utils.logging
    before = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    try:
        with pytest.raises(ValueError, match=r"cannot read the split files .*as parquet: ArrowInvalid"):
            data.load_corpus(tmp_path)
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == []  # no "Failed to read schema" line before wmtp's error
    # and datasets' own logging as it was (left silenced, it passed every test: session 54)
    assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == before
    assert before[0] < hf_logging.CRITICAL


def test_wikitext_without_test_split_raises(tmp_path):
    write_text_split(tmp_path / "wiki.train.raw", SPLIT_LINES["train"])
    write_text_split(tmp_path / "wiki.valid.raw", SPLIT_LINES["valid"])
    with pytest.raises(ValueError, match="has no test split"):
        data.load_corpus(tmp_path)


# --- choosing between the hub and the offline default ------------------------------------------


@pytest.fixture
def online_env(monkeypatch):
    """No offline env vars; the test decides what the network does."""
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def fail_if_called(*args, **kwargs):
    pytest.fail(f"unexpected call with {args} {kwargs}")


@pytest.mark.parametrize("value", ["1", "true", "Yes"])  # huggingface_hub reads them without case
@pytest.mark.parametrize("var", ["HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_env_var_skips_the_socket(monkeypatch, online_env, var, value):
    monkeypatch.setenv(var, value)
    monkeypatch.setattr(socket, "create_connection", fail_if_called)
    assert data._hub_offline_reason(1.5) == f"{var}={value}"


def test_readme_only_dir_falls_back_to_stdlib_when_socket_fails(tmp_path, monkeypatch, online_env):
    def refuse(address, timeout):
        raise ConnectionRefusedError(f"refused {address[0]}:{address[1]}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(data, "_load_from_hub", fail_if_called)
    (tmp_path / "README.md").write_text("WikiText-2 goes here.\n")
    corpus = data.load_corpus(tmp_path, max_chars=20_000)
    assert corpus.name == "python-stdlib"
    assert corpus.source == sysconfig.get_paths()["stdlib"]
    assert corpus.message.startswith(f"no WikiText-2 in {tmp_path} and the hub is unreachable")
    assert "refused huggingface.co:443" in corpus.message
    assert "using the offline default corpus python-stdlib" in corpus.message


def test_reachable_hub_is_used(monkeypatch, online_env):
    calls = []

    def connect(address, timeout):
        calls.append((address, timeout))
        return contextlib.nullcontext()

    fake = data.Corpus("wikitext-2", "a\n", "b\n", "c\n", source="hub:fake", message="fake")
    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(data, "_load_stdlib", fail_if_called)
    monkeypatch.setattr(data, "_load_from_hub", lambda why: fake)
    assert data.load_corpus(hub_timeout_s=0.25) is fake
    assert calls == [(("huggingface.co", 443), 0.25)]


def test_hub_loader_reads_the_hub_splits(monkeypatch):
    """The hub code path, with `datasets.load_dataset` standing in for the network."""
    def fake_load_dataset(repo, config):
        assert (repo, config) == ("Salesforce/wikitext", "wikitext-2-raw-v1")
        return {name: datasets.Dataset.from_dict({"text": ["", f" = {name} = \n", "", " x \n"]})
                for name in ("train", "validation", "test")}

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    corpus = data._load_from_hub("no dataset dir given")
    assert (corpus.name, corpus.source) == ("wikitext-2", "hub:wikitext-2-raw-v1")
    assert corpus.valid == "\n = validation = \n\n x "
    assert corpus.message.startswith("no dataset dir given: loaded Salesforce/wikitext/")


def test_hub_loader_failure_says_what_to_do(monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda repo, config: {"validation": None})
    with pytest.raises(ValueError, match="reachable but loading .* HF_DATASETS_OFFLINE=1"):
        data._load_from_hub("no dataset dir given")


def test_hub_loader_without_datasets_says_what_is_missing(monkeypatch):
    """A missing package is its own one-line error, not 'the hub is reachable but failing'."""
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    with pytest.raises(ValueError, match="needs the `datasets` package"):
        data._load_from_hub("no dataset dir given")


# --- the python-stdlib corpus -------------------------------------------------------------------


@pytest.fixture(scope="module")
def stdlib() -> data.Corpus:
    return data.load_corpus()  # no dir, HF_DATASETS_OFFLINE=1: the offline default


def files_of(text: str) -> list[str]:
    return re.findall(r"^# file: (.+)$", text, flags=re.MULTILINE)


def test_stdlib_corpus_is_deterministic_and_split_by_path_hash(stdlib):
    assert stdlib.name == "python-stdlib"
    assert stdlib.message.startswith("no dataset dir given and the hub is unreachable "
                                     "(HF_DATASETS_OFFLINE=1): using the offline default")
    assert data.load_corpus().fingerprint == stdlib.fingerprint
    assert re.fullmatch(r"[0-9a-f]{16}", stdlib.fingerprint)
    buckets_of = {"train": range(90), "valid": range(90, 95), "test": range(95, 100)}
    for split, buckets in buckets_of.items():
        files = files_of(getattr(stdlib, split))
        assert len(files) >= 10 and files == sorted(files), split
        assert all(int(hashlib.sha1(f.encode()).hexdigest(), 16) % 100 in buckets for f in files)


def test_offline_corpus_needs_no_datasets(tmp_path):
    """`datasets` is imported only to read WikiText files or the hub: without it (a GPU image that
    lacks it), the offline corpus still loads, the same text, and a WikiText dir is a ValueError
    that says what is missing."""
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text(" = Title = \n some text \n")
    code = ("import sys; sys.modules['datasets'] = None\n"  # `import datasets` now raises ImportError
            "from wmtp import data\n"
            "print(data.load_corpus(max_chars=200_000).fingerprint)\n"
            f"try:\n    data.load_corpus({str(tmp_path)!r})\n"
            "except ValueError as err:\n    print(err)")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    fingerprint, error = out.stdout.strip().split("\n")
    assert fingerprint == data.load_corpus(max_chars=200_000).fingerprint
    assert "needs the `datasets` package" in error and "HF_DATASETS_OFFLINE=1" in error


def test_stdlib_corpus_leaves_out_tests_and_installed_packages(stdlib):
    files = files_of(stdlib.train + stdlib.valid + stdlib.test)
    assert "os.py" in files and "json/decoder.py" in files
    assert not [f for f in files if EXCLUDED_DIRS.intersection(f.split("/")[:-1])]
    root = Path(stdlib.source)
    assert (root / "test").is_dir()  # there was something to leave out
    os_py = (root / "os.py").read_text(encoding="utf-8")
    assert f"# file: os.py\n{os_py}" in stdlib.train + stdlib.valid + stdlib.test


def test_max_chars_cuts_each_split_at_a_line_boundary(stdlib):
    small = data.load_corpus(max_chars=5000)
    assert 0 < len(small.train) <= 5000
    assert 0 < len(small.valid) <= 500 and 0 < len(small.test) <= 500
    for split in data.SPLITS:
        full = getattr(stdlib, split)
        cut = getattr(small, split)
        assert full.startswith(cut) and full[len(cut)] == "\n"
    assert "max_chars=5000" in small.message
    assert small.fingerprint != stdlib.fingerprint


def test_leading_lines_cuts_and_tiny_corpora_keep_a_character():
    """Mutation round 3: ``leading_lines``' bounds and ``_truncate_corpus``' floor of one character
    for valid and test, literal cases; the first layout name of a split wins; the fingerprint keeps
    its fields apart."""
    assert data.leading_lines("ab\n", 3) == "ab\n"  # fits: whole, its last line break kept
    assert data.leading_lines("ab\ncd\nef", 5) == "ab"
    assert data.leading_lines("\nabcdef", 4) == "\nabc"  # the only break at 0: cut by characters, not to ""
    assert data.leading_lines("abcdef", 4) == "abcd"
    corpus = data.Corpus("x", "a\n" * 20, "v\n" * 20, "t\n" * 20, source="s", message="m")
    small = data._truncate_corpus(corpus, 5)  # valid and test to max(5 // 10, 1) = 1 character
    assert (small.train, small.valid, small.test) == ("a\na", "v", "t")
    assert data.Corpus("a", "bc", "", "", "s", "m").fingerprint != data.Corpus("ab", "c", "", "", "s", "m").fingerprint


def test_the_first_name_of_a_split_wins(tmp_path):
    for name in ("train.txt", "valid.txt", "validation.txt", "test.txt"):
        (tmp_path / name).write_text("a line\n")
    builder, files = data._find_split_files(tmp_path)
    assert builder == "text" and {k: p.name for k, p in files.items()} == {
        "train": "train.txt", "valid": "valid.txt", "test": "test.txt"}
    both = tmp_path / "both"  # one folder of raw and tokenized text (its <unk> markers): the raw
    for split in ("train", "valid", "test"):
        for kind in ("tokens", "raw"):
            write_text_split(both / f"wiki.{split}.{kind}", [kind])
    assert {k: p.name for k, p in data._find_split_files(both)[1].items()} == {
        "train": "wiki.train.raw", "valid": "wiki.valid.raw", "test": "wiki.test.raw"}
