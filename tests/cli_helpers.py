"""What the command-line test files (tests/test_cli_*.py) share: a call of the ``wmtp`` command that
returns its exit code and what it printed, and a recorder of the prefills a bench makes and the one
each of its runs starts from. The small WikiText-format corpus they train on is tests/conftest.py's
``wikitext_dir`` fixture."""

from wmtp.cli import main


def run_cli(capsys, argv, entry=main):
    """``entry(argv)`` (the ``wmtp`` command by default): its exit code, stdout and stderr."""
    code = entry(argv)
    out, err = capsys.readouterr()
    return code, out, err


def record_prefills(monkeypatch) -> tuple[list, list]:
    """Lists that fill, as a bench runs, with each prefill it makes and the prefill each run starts from."""
    import wmtp.bench_common
    import wmtp.decode

    prefills, starts = [], []
    monkeypatch.setattr(wmtp.bench_common, "prefill_prompt",
                        lambda *a, **k: prefills.append(wmtp.prefill.prefill_prompt(*a, **k)) or prefills[-1])
    monkeypatch.setattr(wmtp.decode, "start",
                        lambda *a, **k: starts.append(k["prefill"]) or wmtp.prefill.start(*a, **k))
    return prefills, starts
