"""Tests of wmtp.tokenizer: the byte-level BPE, exact encoding and decoding, its cache."""

import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported: never reach for the hub

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wmtp import data
from wmtp import tokenizer as tokenizer_mod
from wmtp.data import leading_lines


def fail_if_called(*args, **kwargs):
    pytest.fail(f"unexpected call with {args} {kwargs}")


@pytest.fixture(scope="module")
def small_corpus() -> data.Corpus:
    return data.load_corpus(max_chars=100_000)


@pytest.fixture(scope="module")
def tokenizer(small_corpus, tmp_path_factory):
    return tokenizer_mod.train_tokenizer(small_corpus, 300, tmp_path_factory.mktemp("tok"))


def test_tokenizer_vocab_and_eos(tokenizer):
    assert tokenizer.get_vocab_size() == 300
    assert tokenizer_mod.eos_id(tokenizer) == 0 and tokenizer.id_to_token(0) == tokenizer_mod.EOS


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=200))
def test_decode_of_encode_is_exact_for_any_text(tokenizer, text):
    assert tokenizer_mod.decode(tokenizer, tokenizer_mod.encode(tokenizer, text)) == text


def test_encode_is_chunk_by_chunk(tokenizer, small_corpus):
    text = small_corpus.valid + "\r\nnaïve — 日本語 🙂\t" + tokenizer_mod.EOS + "\n\n"
    ids = tokenizer_mod.encode(tokenizer, text, lines_per_chunk=7)
    assert ids.dtype == torch.long and ids.dim() == 1
    lines = text.splitlines(keepends=True)
    chunks = ["".join(lines[k:k + 7]) for k in range(0, len(lines), 7)]
    expected = [i for chunk in chunks for i in tokenizer.encode(chunk).ids]
    assert ids.tolist() == expected
    assert tokenizer_mod.decode(tokenizer, ids) == text
    assert tokenizer_mod.eos_id(tokenizer) in ids.tolist()
    empty = tokenizer_mod.encode(tokenizer, "")
    assert empty.shape == (0,) and empty.dtype == torch.long  # torch.empty(0) alone is float32
    many = "".join(f"line {k} of {k % 7} words\n" for k in range(600))  # 600 chunks: 256 a batch, three batches
    one_by_one = [i for line in many.splitlines(keepends=True) for i in tokenizer.encode(line).ids]
    assert tokenizer_mod.encode(tokenizer, many, lines_per_chunk=1).tolist() == one_by_one


def test_corpus_token_splits(tokenizer, small_corpus):
    splits = tokenizer_mod.corpus_token_splits(small_corpus, tokenizer)
    assert sorted(splits) == ["test", "train", "valid"]
    for split, ids in splits.items():
        assert torch.equal(ids, tokenizer_mod.encode(tokenizer, getattr(small_corpus, split)))
        assert tokenizer_mod.decode(tokenizer, ids) == getattr(small_corpus, split)


def test_tokenizer_cache_hit_does_not_retrain(small_corpus, tmp_path, monkeypatch):
    first = tokenizer_mod.train_tokenizer(small_corpus, 300, tmp_path)
    path = tmp_path / f"tokenizer-python-stdlib-{small_corpus.fingerprint}-v300.json"
    assert os.listdir(tmp_path) == [path.name]  # no temp file left beside it
    mtime = path.stat().st_mtime_ns
    monkeypatch.setattr(tokenizer_mod, "_train_bpe", fail_if_called)
    again = tokenizer_mod.train_tokenizer(small_corpus, 300, tmp_path)
    assert again.get_vocab() == first.get_vocab()
    assert path.stat().st_mtime_ns == mtime


def test_damaged_cached_tokenizer_is_a_clear_error(small_corpus, tmp_path):
    path = tmp_path / f"tokenizer-python-stdlib-{small_corpus.fingerprint}-v300.json"
    path.write_text("{bad")
    with pytest.raises(ValueError, match=f"cached tokenizer {path} cannot be read .*: delete it to train it anew"):
        tokenizer_mod.train_tokenizer(small_corpus, 300, tmp_path)


def test_failed_tokenizer_write_leaves_no_file(small_corpus, tmp_path, monkeypatch):
    class HalfWritten:
        def save(self, path):
            Path(path).write_text('{"half": ')
            raise OSError("disk full")

    monkeypatch.setattr(tokenizer_mod, "_train_bpe", lambda text, vocab_size: HalfWritten())
    with pytest.raises(OSError, match="disk full"):
        tokenizer_mod.train_tokenizer(small_corpus, 300, tmp_path / "cache")
    assert os.listdir(tmp_path / "cache") == []


def test_tokenizer_rejects_a_vocab_smaller_than_the_bytes(small_corpus, tmp_path):
    with pytest.raises(ValueError, match="vocab_size must be >= 257"):
        tokenizer_mod.train_tokenizer(small_corpus, 256, tmp_path)


@pytest.mark.parametrize("args, match", [  # 2**40 aborted the whole process (the trainer's allocation failed)
    ((2**40, "cache"), r"vocab_size must be >= 257 .* and <= 2\*\*24, an integer; got 1099511627776"),
    ((300.0, "cache"), "an integer; got 300.0"),  # TypeErrors before
    (("300", "cache"), "an integer; got '300'"),
    ((None, "cache"), "an integer; got None"),
    ((300, None), "cache_dir must be a str or a Path, got NoneType"),
])
def test_tokenizer_refuses_bad_arguments(small_corpus, tmp_path, args, match):
    vocab_size, cache_dir = args
    with pytest.raises(ValueError, match=match):
        tokenizer_mod.train_tokenizer(small_corpus, vocab_size, None if cache_dir is None else tmp_path / cache_dir)


@pytest.mark.parametrize("ids, match", [  # OverflowError, TypeError or RuntimeError from tokenizers or torch before
    ([-1, 41], r"token ids must lie in \[0, 2\*\*32\), got -1..41"),
    ([2**40], r"token ids must lie in \[0, 2\*\*32\)"),
    ([1.5], r"ids must be a 1-D integer tensor or a list of ints, got torch.float32 \(1,\)"),
    ([[1, 2]], r"got torch.int64 \(1, 2\)"),
    (torch.tensor(5), r"got torch.int64 \(\)"),
    (torch.tensor([True, False]), "got torch.bool"),  # decoded as ids 1 and 0 before
    (None, "got NoneType"),
    ("ab", "got str"),
])
def test_decode_refuses_what_are_not_token_ids(tokenizer, ids, match):
    with pytest.raises(ValueError, match=match):
        tokenizer_mod.decode(tokenizer, ids)


@pytest.mark.parametrize("text, lines_per_chunk, match", [
    ("a\nb\n", -1, "lines_per_chunk must be an integer >= 1, got -1"),  # an empty tensor before, silently
    ("a\nb\n", 0, "lines_per_chunk must be an integer >= 1, got 0"),  # range()'s 'arg 3 must not be zero'
    ("a\nb\n", 1.5, "lines_per_chunk must be an integer >= 1, got 1.5"),  # a TypeError
    (None, 200, "text must be a str, got NoneType"),  # AttributeError
    (b"a\n", 200, "text must be a str, got bytes"),  # TypeError
])
def test_encode_refuses_bad_arguments(tokenizer, text, lines_per_chunk, match):
    with pytest.raises(ValueError, match=match):
        tokenizer_mod.encode(tokenizer, text, lines_per_chunk=lines_per_chunk)


def test_tokenizer_refuses_a_corpus_that_is_not_one(tmp_path):
    with pytest.raises(ValueError, match="corpus must be a wmtp.data.Corpus .*, got NoneType"):  # an AttributeError
        tokenizer_mod.train_tokenizer(None, 300, tmp_path)


def test_the_tokenizer_trains_on_the_leading_lines_of_train_only(small_corpus, tmp_path, monkeypatch):
    """Training reads at most TOKENIZER_TRAIN_CHARS leading characters of train, at a line boundary
    (mutation round 3: training on the whole text survived every test)."""
    seen = []
    train_bpe = tokenizer_mod._train_bpe
    monkeypatch.setattr(tokenizer_mod, "_train_bpe", lambda text, vocab: seen.append(text) or train_bpe(text, vocab))
    monkeypatch.setattr(tokenizer_mod, "TOKENIZER_TRAIN_CHARS", 1000)
    tokenizer_mod.train_tokenizer(small_corpus, 300, tmp_path)
    assert len(small_corpus.train) > 1000 and seen == [leading_lines(small_corpus.train, 1000)]
    assert 0 < len(seen[0]) <= 1000 and small_corpus.train[len(seen[0])] == "\n"
