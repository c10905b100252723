"""The byte-level BPE tokenizer that wmtp trains on its corpora (wmtp/data.py; library plumbing,
beyond the paper, arXiv 2607.21535).

`train_tokenizer` trains (or loads from its cache) a byte-level BPE through `tokenizers`; `encode`
and `decode` turn text into a 1-D LongTensor of token ids and back, exactly; `eos_id` is the
end-of-sequence token's id; `corpus_token_splits` encodes a corpus's three splits.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .checks import check_int
from .data import SPLITS, Corpus, leading_lines
from .fileio import atomic_path

__all__ = ["EOS", "corpus_token_splits", "decode", "encode", "eos_id", "train_tokenizer"]

EOS = "<|endoftext|>"  # the one special token; id 0
TOKENIZER_TRAIN_CHARS = 8_000_000  # BPE trains on at most this many leading chars of train
LINES_PER_CHUNK = 200  # encode() tokenizes text in chunks of this many lines
MAX_VOCAB = 2**24  # far past any vocabulary in use (~2**17 at most); 2**40 aborted the process (the trainer's table)


def train_tokenizer(corpus: Corpus, vocab_size: int, cache_dir: str | Path) -> Tokenizer:
    """A byte-level BPE trained on `corpus.train`, loaded from `cache_dir` when already trained.

    Byte-level means every string encodes and decodes back exactly, with no unknown token. The
    only special token is `<|endoftext|>`, id 0. Training reads at most the first
    TOKENIZER_TRAIN_CHARS (8M) characters of train, at a line boundary, which bounds its time
    and memory (the stdlib corpus, 11M characters, trains in seconds on 2 CPU cores). The file
    is `cache_dir/tokenizer-{name}-{fingerprint}-v{vocab_size}.json`, written atomically.

    Args:
        corpus: the corpus; only its train split is read.
        vocab_size: size of the vocabulary including the 256 bytes and `<|endoftext|>` (257 to 2**24).
        cache_dir: directory of tokenizer files; created if missing.

    Returns:
        The tokenizer.

    Raises:
        ValueError: for a `corpus` that is not a `Corpus`, a `vocab_size` that is not an int in
            [257, 2**24], a `cache_dir` that is not a path, or a damaged cached file.
    """
    if not isinstance(corpus, Corpus):
        raise ValueError(f"corpus must be a wmtp.data.Corpus (load_corpus's), got {type(corpus).__name__}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 257 <= vocab_size <= MAX_VOCAB:
        raise ValueError(f"vocab_size must be >= 257 (256 bytes + {EOS}) and <= 2**24, an integer; got {vocab_size!r}")
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise ValueError(f"cache_dir must be a str or a Path, got {type(cache_dir).__name__}")
    path = Path(cache_dir) / f"tokenizer-{corpus.name}-{corpus.fingerprint}-v{vocab_size}.json"
    if path.is_file():
        try:
            return Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for a damaged file
            raise ValueError(f"cached tokenizer {path} cannot be read ({e}): delete it to train it anew") from None
    tokenizer = _train_bpe(leading_lines(corpus.train, TOKENIZER_TRAIN_CHARS), vocab_size)
    with atomic_path(path) as tmp:  # a reader never sees half a file
        tokenizer.save(str(tmp))
    return tokenizer


def _train_bpe(text: str, vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE with `<|endoftext|>` as id 0 on `text`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_line_chunks(text, LINES_PER_CHUNK), trainer=trainer)
    return tokenizer


def eos_id(tokenizer: Tokenizer) -> int:
    """The id of `<|endoftext|>` (0 for tokenizers made by `train_tokenizer`)."""
    token_id = tokenizer.token_to_id(EOS)
    if token_id is None:
        raise ValueError(f"tokenizer has no {EOS} token")
    return token_id


def _line_chunks(text: str, lines_per_chunk: int) -> list[str]:
    """`text` cut after every `lines_per_chunk` lines; the chunks join back to `text` exactly."""
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i:i + lines_per_chunk]) for i in range(0, len(lines), lines_per_chunk)]


def encode(tokenizer: Tokenizer, text: str, *,
           lines_per_chunk: int = LINES_PER_CHUNK) -> torch.Tensor:
    """Token ids of `text` as a 1-D LongTensor, encoded in parallel chunks of lines.

    Each chunk of `lines_per_chunk` lines is encoded on its own (`encode_batch` runs them on all
    cores), so no token straddles a chunk boundary: the ids equal those of encoding chunk by
    chunk, which can differ slightly from encoding the whole text at once (about 0.05% more
    tokens on the stdlib corpus). For training a language model that is harmless, and it is
    several times faster.

    Args:
        tokenizer: a tokenizer from `train_tokenizer`.
        text: the text; any string.
        lines_per_chunk: lines per chunk.

    Returns:
        LongTensor (N,) of token ids; `decode` gives `text` back exactly.

    Raises:
        ValueError: for a `text` that is not a str, or a `lines_per_chunk` that is not an int >= 1.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    check_int("lines_per_chunk", lines_per_chunk, 1)  # -1 gave no chunks: an empty tensor for any text
    ids: list[np.ndarray] = []
    chunks = _line_chunks(text, lines_per_chunk)
    for start in range(0, len(chunks), 256):  # 256 chunks at a time bounds the Encoding objects
        batch = tokenizer.encode_batch(chunks[start:start + 256], add_special_tokens=False)
        ids += [np.asarray(e.ids, dtype=np.int64) for e in batch]
    return torch.from_numpy(np.concatenate(ids)) if ids else torch.empty(0, dtype=torch.long)


def decode(tokenizer: Tokenizer, ids: torch.Tensor | list[int]) -> str:
    """The text of token ids (a 1-D tensor or a list), special tokens included. An id past the
    tokenizer's vocabulary decodes to nothing (a model may have more ids than a BPE trained on a small
    corpus learned).

    Raises:
        ValueError: for ids that are not a 1-D integer tensor or list of ints in ``[0, 2**32)``.
    """
    try:
        t = torch.as_tensor(ids)
    except (TypeError, RuntimeError, ValueError, OverflowError):  # None, a str, ragged lists, ints past int64
        t = None
    if t is None or t.dim() != 1 or (t.numel() and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)):
        got = type(ids).__name__ if t is None else f"{t.dtype} {tuple(t.shape)}"
        raise ValueError(f"ids must be a 1-D integer tensor or a list of ints, got {got}")
    ids = t.tolist()
    if ids and not 0 <= min(ids) <= max(ids) < 2**32:  # tokenizers' OverflowError (its ids are u32)
        raise ValueError(f"token ids must lie in [0, 2**32), got {min(ids)}..{max(ids)}")
    return tokenizer.decode(ids, skip_special_tokens=False)


def corpus_token_splits(corpus: Corpus, tokenizer: Tokenizer) -> dict[str, torch.Tensor]:
    """{"train", "valid", "test"}: each split of `corpus` encoded by `encode`."""
    return {split: encode(tokenizer, getattr(corpus, split)) for split in SPLITS}
