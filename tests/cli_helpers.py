"""What the command-line test files (tests/test_cli_*.py) share: a call of the ``wmtp`` command that
returns its exit code and what it printed, a recorder of the prefills a bench makes and the one
each of its runs starts from, a recorder of the loops that capture CUDA graphs, and the cells of a
bench's rich table as printed. The small
WikiText-format corpus they train on is tests/conftest.py's ``wikitext_dir`` fixture."""

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


def record_captures(monkeypatch) -> list[str]:
    """A list that fills, as a bench runs, with the static loop (``static_*`` in wmtp/static_decode.py,
    static_lockstep.py, static_batched.py) of each CUDA graph captured (``runner``, wmtp/graphs.py)."""
    import traceback

    import wmtp.graphs

    loops, capture = [], wmtp.graphs.capture_graph

    def spy(*args, **kwargs):
        loops.extend(f.name for f in traceback.extract_stack() if f.name.startswith("static_"))
        return capture(*args, **kwargs)

    monkeypatch.setattr(wmtp.graphs, "capture_graph", spy)
    return loops


def table_cells(table) -> list[list[str]]:
    """The body lines of a rich ``table`` as printed (200 columns), each a list of its cells' text."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(table)
    return [[c.strip() for c in line.split("│")[1:-1]] for line in console.export_text().splitlines() if "│" in line]
