"""Text corpora that wmtp trains on (the tokenizer is wmtp/tokenizer.py; how the text is found is
beyond the paper, arXiv 2607.21535).

`load_corpus` finds WikiText-2 (Merity et al., 2016), the corpus of the Windowed-MTP experiments,
in this order, and says in `Corpus.message` what it loaded and what it substituted:

1. a local directory you pass (any of the usual layouts, read through `datasets`);
2. the HuggingFace hub (`wikitext-2-raw-v1`), only when huggingface.co answers quickly;
3. offline default `python-stdlib`: the standard-library source of the running Python, which
   every machine has, split 90/5/5 into train/valid/test by a stable hash of each file's path.

`load_corpus(..., max_chars=...)` cuts the splits short (`leading_lines`) for quick runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import sysconfig
import tempfile
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

HUB_HOST, HUB_REPO, HUB_CONFIG = "huggingface.co", "Salesforce/wikitext", "wikitext-2-raw-v1"
SPLITS = ("train", "valid", "test")

# File names of each split in the WikiText layouts, first match wins: the original zips
# (wiki.train.raw / wiki.train.tokens), pytorch/examples (train.txt) and the hub's parquet.
_SPLIT_NAMES = {"train": ("train",), "valid": ("valid", "validation"), "test": ("test",)}
_TEXT_LAYOUTS = ("wiki.{}.raw", "wiki.{}.tokens", "{}.txt")
# Directories left out of the python-stdlib corpus: installed packages and the test suites.
_STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
_TRUE = {"1", "ON", "YES", "TRUE"}  # what huggingface_hub accepts as a true env value


@dataclass(frozen=True)
class Corpus:
    """The raw text of a corpus' three splits, and where it came from.

    Attributes:
        name: "wikitext-2" or "python-stdlib".
        train, valid, test: raw text of each split (left out of repr: they are megabytes).
        source: a directory path, "hub:wikitext-2-raw-v1", or the stdlib path.
        message: one human line saying what was loaded and anything substituted.
    """

    name: str
    train: str = field(repr=False)
    valid: str = field(repr=False)
    test: str = field(repr=False)
    source: str
    message: str

    @cached_property
    def fingerprint(self) -> str:
        """First 16 hex chars of sha256 over the name and the three texts (a cache key)."""
        digest = hashlib.sha256()
        for part in (self.name, self.train, self.valid, self.test):
            digest.update(part.encode("utf-8", errors="surrogatepass") + b"\0")
        return digest.hexdigest()[:16]


def load_corpus(dataset_dir: str | Path | None = None, *, hub_timeout_s: float = 1.5,
                max_chars: int | None = None) -> Corpus:
    """Load WikiText-2 from `dataset_dir`, else from the hub, else the offline python-stdlib corpus.

    Args:
        dataset_dir: a directory holding WikiText-2 itself or in a subdirectory one level down
            (e.g. `data/wikitext-2-raw/`), in any layout: `wiki.{train,valid,test}.{raw,tokens}`,
            `{train,valid,test}.txt` or the hub's `{train,validation,test}-*.parquet`. If it holds
            valid and test but no train split, valid becomes the training text and test is cut
            in two at a line boundary (first half valid, second half test). A directory without
            WikiText falls through to the hub and then to python-stdlib.
        hub_timeout_s: how long to wait for huggingface.co:443 before calling the hub unreachable.
            HF_DATASETS_OFFLINE=1 or HF_HUB_OFFLINE=1 skips the attempt.
        max_chars: if given, cut train to at most `max_chars` characters and valid and test to at
            most `max(max_chars // 10, 1)` each, at a line boundary where there is one.

    Returns:
        The Corpus; its `message` says what was loaded and anything substituted.

    Raises:
        ValueError: `dataset_dir` does not exist, is not a directory or is empty; it holds only
            part of WikiText-2 (no valid or no test split); a split file is empty or cannot be
            read (not UTF-8 text, a broken parquet file); the hub is reachable but fails; or
            `max_chars` is below 1.
    """
    if dataset_dir is not None:
        folder = Path(dataset_dir)
        if not folder.exists():
            raise ValueError(f"dataset dir '{folder}' does not exist")
        if not folder.is_dir():
            raise ValueError(f"dataset dir '{folder}' is not a directory")
        if not any(folder.iterdir()):
            raise ValueError(f"dataset dir '{folder}' is empty")
        corpus = _load_local_wikitext(folder)
        why = f"no WikiText-2 in {folder}"
    else:
        corpus, why = None, "no dataset dir given"
    if corpus is None:
        offline_because = _hub_offline_reason(hub_timeout_s)
        if offline_because is None:
            corpus = _load_from_hub(why)
        else:
            corpus = _load_stdlib(f"{why} and the hub is unreachable ({offline_because})")
    return corpus if max_chars is None else _truncate_corpus(corpus, max_chars)


def _load_local_wikitext(folder: Path) -> Corpus | None:
    """WikiText-2 from `folder` or one of its subdirectories, or None if there is none."""
    # Subdirectories: raw variants first; never WikiText-103 (a different, 50x larger corpus).
    subdirs = sorted((d for d in folder.iterdir() if d.is_dir() and "103" not in d.name),
                     key=lambda d: ("raw" not in d.name, d.name))
    for candidate in (folder, *subdirs):
        found = _find_split_files(candidate)
        if found is not None:
            return _read_wikitext(candidate, *found)
    return None


def _find_split_files(folder: Path) -> tuple[str, dict[str, Path]] | None:
    """The first WikiText layout in `folder` as (builder, {split: file}), or None."""
    for pattern in _TEXT_LAYOUTS:
        files = {}
        for split, names in _SPLIT_NAMES.items():
            existing = [p for n in names if (p := folder / pattern.format(n)).is_file()]
            if existing:
                files[split] = existing[0]
        if files:
            return "text", files
    files = {}
    for path in sorted(folder.glob("*.parquet")):
        for split, names in _SPLIT_NAMES.items():
            if path.name.startswith(names):
                files.setdefault(split, path)  # hub splits are single files; take the first
    return ("parquet", files) if files else None


def _read_wikitext(folder: Path, builder: str, files: dict[str, Path]) -> Corpus:
    """Read the split files through `datasets` and make the Corpus, substituting a missing train."""
    missing = [split for split in ("valid", "test") if split not in files]
    if missing:
        raise ValueError(f"WikiText-2 in '{folder}' has no {' or '.join(missing)} split "
                         f"(found {', '.join(p.name for p in files.values())})")
    texts = _read_with_datasets(builder, files)
    layout = ", ".join(p.name for p in files.values())
    if "train" in files:
        return Corpus("wikitext-2", texts["train"], texts["valid"], texts["test"],
                      source=str(folder), message=f"loaded WikiText-2 from {folder} ({layout})")
    lines = texts["test"].split("\n")
    half = len(lines) // 2
    return Corpus("wikitext-2", train=texts["valid"], valid="\n".join(lines[:half]),
                  test="\n".join(lines[half:]), source=str(folder),
                  message=f"WikiText-2 in {folder} has no train split: training on its "
                          "valid split, evaluating on its test split "
                          "(first half valid, second half test)")


def _read_with_datasets(builder: str, files: dict[str, Path]) -> dict[str, str]:
    """{split: text} read by `datasets.load_dataset(builder)`; rows are lines, joined with "\\n"."""
    for path in files.values():
        if path.stat().st_size == 0:  # checked before datasets sees it, which may fail oddly
            raise ValueError(f"split file '{path}' is empty")
    # A throwaway cache, so that nothing is written into the dataset dir or left behind.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as cache, _quiet_datasets():
        try:
            dataset = _datasets().load_dataset(builder, cache_dir=cache,
                                               data_files={split: str(p) for split, p in files.items()})
        except Exception as err:  # a file datasets cannot parse (not UTF-8, a broken parquet): say which
            cause = err.__cause__ or err  # datasets wraps the parser's error in DatasetGenerationError
            raise ValueError(f"cannot read the split files {sorted(map(str, files.values()))} "
                             f"as {builder}: {type(cause).__name__}: {cause}") from err
        texts = {split: _join_lines(dataset[split]["text"]) for split in files}
        del dataset  # let go of its memory-mapped files before the cache is deleted
    for split, text in texts.items():
        if not text.strip():
            raise ValueError(f"split file '{files[split]}' is empty (only whitespace)")
    return texts


def _join_lines(rows) -> str:
    """Join dataset rows into one text. Hub rows keep their "\\n" (blank lines are ""): drop it."""
    return "\n".join(row.removesuffix("\n") for row in rows)


def _datasets():
    """The `datasets` module, imported on first use: only WikiText files and the hub need it, so the
    offline corpus (and `import wmtp.data`) works without it and skips its ~1 s import.

    Raises:
        ValueError: `datasets` is not installed (one line for the CLI, saying what to do).
    """
    try:
        import datasets
    except ImportError as err:
        raise ValueError(f"reading WikiText-2 (a dataset dir or the hub) needs the `datasets` package ({err}); "
                         f"pip install datasets, or set HF_DATASETS_OFFLINE=1 and pass no dataset dir "
                         f"to use the offline corpus python-stdlib") from err
    return datasets


@contextlib.contextmanager
def _quiet_datasets():
    """Hide the progress bars and log lines of `datasets` for the duration, then restore both as
    they were. Its log lines repeat a parser's error (a broken parquet file) before wmtp's own
    one-line error says the same, naming the files."""
    logging = _datasets().utils.logging
    was_enabled, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if was_enabled:
            logging.enable_progress_bar()


def _hub_offline_reason(timeout_s: float) -> str | None:
    """None if huggingface.co accepts a TCP connection within `timeout_s`, else why not.

    The hub's own client retries for a long time when offline, so we look first. The name
    lookup (DNS) is not bounded by `timeout_s`; on a machine without a resolver it fails at once.
    """
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(var, "").upper() in _TRUE:
            return f"{var}={os.environ[var]}"
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout_s):
            return None
    except OSError as err:
        return f"{HUB_HOST}:443: {err}"


def _load_from_hub(why: str) -> Corpus:
    """WikiText-2 (raw) from the HuggingFace hub, cached in the user's `datasets` cache."""
    datasets = _datasets()  # a missing package is its own error, not a failing hub
    try:
        with _quiet_datasets():
            dataset = datasets.load_dataset(HUB_REPO, HUB_CONFIG)  # the alias "wikitext" is legacy
        hub_names = {"train": "train", "valid": "validation", "test": "test"}
        texts = {ours: _join_lines(dataset[theirs]["text"]) for ours, theirs in hub_names.items()}
    except Exception as err:  # reachable but failing: say what to do instead of hiding it (one line: the CLI's exit 2)
        raise ValueError(f"huggingface.co is reachable but loading {HUB_REPO}/{HUB_CONFIG} "
                           f"failed ({err!r}); pass a dataset dir, or set HF_DATASETS_OFFLINE=1 "
                           f"to use the offline default corpus python-stdlib") from err
    return Corpus("wikitext-2", **texts, source=f"hub:{HUB_CONFIG}",
                  message=f"{why}: loaded {HUB_REPO}/{HUB_CONFIG} from the HuggingFace hub")


def _load_stdlib(why: str) -> Corpus:
    """The python-stdlib corpus: every stdlib `*.py` file but tests, split by a hash of its path.

    Files are sorted by relative path, each prefixed by a `# file: relative/path.py` line. A file
    goes to train, valid or test when sha1(path) mod 100 is < 90, < 95 or otherwise, so the split
    of a file never depends on which other files this Python has.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: dict[str, list[str]] = {split: [] for split in SPLITS}
    for rel in _stdlib_files(root):
        bucket = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 100
        split = "train" if bucket < 90 else "valid" if bucket < 95 else "test"
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        parts[split].append(f"# file: {rel}\n{text}" + ("" if text.endswith("\n") else "\n"))
    return Corpus("python-stdlib", **{split: "".join(p) for split, p in parts.items()},
                  source=str(root),
                  message=f"{why}: using the offline default corpus python-stdlib "
                          f"(the standard-library source of this Python, {root})")


def _stdlib_files(root: Path) -> list[str]:
    """Relative POSIX paths of the `*.py` files under `root`, sorted, test suites left out."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP_DIRS]  # prune, don't descend
        rel_dir = Path(dirpath).relative_to(root)
        found += [(rel_dir / f).as_posix() for f in filenames if f.endswith(".py")]
    return sorted(found)


def leading_lines(text: str, max_chars: int) -> str:
    """At most `max_chars` leading characters of `text`, ending at a line boundary if possible."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n", 0, max_chars)
    return text[:cut] if cut > 0 else text[:max_chars]


def _truncate_corpus(corpus: Corpus, max_chars: int) -> Corpus:
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    small = max(max_chars // 10, 1)
    return replace(corpus, train=leading_lines(corpus.train, max_chars),
                   valid=leading_lines(corpus.valid, small), test=leading_lines(corpus.test, small),
                   message=f"{corpus.message}; cut to max_chars={max_chars} "
                           f"(valid and test to {small})")
