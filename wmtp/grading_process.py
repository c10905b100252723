"""The grader's child process: a student's file is imported and graded away from ``wmtp grade``.

``grade`` (wmtp/grading.py) runs ``python -m wmtp.grading_process ASSIGNMENT FILE RESULT`` with a
time limit. The child imports the file (registered in ``sys.modules`` while it runs, so that
dataclasses and the like work, with the file's folder on ``sys.path``, so that it may import a
helper beside it), grades its function with ``grade_function`` and writes the report as JSON to
``RESULT``. So a student's file that loops, hard-exits (``os._exit``) or rewrites the grader's
module state cannot pass: the parent gives a failed grade for a timeout, for a child that ended
without a report, and for a report of fewer checks than the assignment has; the first two name the
check the child was on (it records each in ``RESULT.case`` before running it). This keeps honest
mistakes from passing; it is not a security boundary against a file written to cheat. What the
child prints goes to the parent's stderr cut to its first ``SHOWN_LINES`` and last ``TAIL_LINES``
lines (a print in the graded function runs once a check). The time limit starts once the child has
loaded Python, torch and the grader (it prints ``STARTED`` then), so a busy machine's slow start
fails no file.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path

SHOWN_LINES, TAIL_LINES = 20, 5  # the first and last lines of the student's output (prints) shown
STARTED = "wmtp.grading_process: loaded, importing the student's file\n"  # the child's first line, not shown
STARTUP_S = 300.0  # at most this long to load before the time limit starts anyway


def run(assignment: str, path: Path, timeout_s: float, log=None) -> dict:
    """The child's report as a dict: ``GradeReport``'s fields, or ``{"error": kind, "message": ...}``
    for a file without the function (``value``) or a grader out of date (``grader``), or
    ``{"timeout": s}`` / ``{"no_report": exit status}``, with ``check`` and ``case`` (the check it was on)
    once one started. What the file printed (stdout and stderr) goes to ``log`` (default
    ``sys.stderr``): its first ``SHOWN_LINES`` lines, how many more there were, and the last
    ``TAIL_LINES`` of those. ``timeout_s`` counts from the child's ``STARTED`` line."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "report.json"
        cmd = [sys.executable, "-u", "-m", "wmtp.grading_process", assignment, str(path), str(result)]  # -u: a
        # pipe would hold prints in a buffer that a killed or hard-exiting child never writes
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        shown, tail, more, started = [], collections.deque(maxlen=TAIL_LINES), [0], threading.Event()
        reader = threading.Thread(target=_head, args=(proc.stdout, shown, tail, more, started), daemon=True)
        reader.start()
        started.wait(STARTUP_S)  # set by the STARTED line, or by the end of the output (a child that failed early)
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            timed_out = True
        reader.join(timeout=5)  # a process the file started may hold the pipe open: do not wait on it
        if shown:
            tail = list(tail)
            cut = more[0] - len(tail)
            lines = "".join(f"  | {line}" for line in shown[:SHOWN_LINES])
            lines += f"  ({cut} more lines)\n" if cut else ""
            lines += "".join(f"  | {line}" for line in tail)
            (log or sys.stderr).write(f"output while grading {path.name}:\n{lines}")
        at = _last_check(Path(f"{result}.case"))
        if timed_out:
            return {"timeout": timeout_s, **at}
        if not result.is_file():
            return {"no_report": proc.returncode, **at}
        return json.loads(result.read_text())


def _last_check(path: Path) -> dict:
    """``{"check": n, "case": ...}``, the check the child last started (``_child`` records each), or {}."""
    try:
        n, case = path.read_text().split("\t", 1)
        return {"check": int(n), "case": case}
    except (OSError, ValueError):  # none started yet, or a record cut short by a kill
        return {}


def _head(stream, shown: list[str], tail: collections.deque, more: list[int], started: threading.Event) -> None:
    """Read ``stream`` to its end, keeping its first ``SHOWN_LINES`` lines and its last ``TAIL_LINES``
    after them (a traceback's last line is the one that says what went wrong) and counting the lines
    past the first: a file that prints in a loop neither fills memory nor the student's terminal. The
    child's ``STARTED`` line sets ``started`` (not kept); so does the end of the stream."""
    for raw in iter(lambda: stream.readline(1000), b""):  # a line of over 1000 bytes counts as several
        line = raw.decode(errors="replace")
        if not started.is_set() and line == STARTED:
            started.set()
            continue
        line = line if line.endswith("\n") else line + "\n"
        if len(shown) < SHOWN_LINES:
            shown.append(line)
        else:
            tail.append(line)
            more[0] += 1
    stream.close()
    started.set()


def load_student(assignment: str, path: Path):
    """Import the student's file and return its function, or a failed ``GradeReport`` if the file
    does not import. Registered in ``sys.modules`` (dataclasses look their module up there), with the
    file's folder first on ``sys.path`` (a helper beside it imports), for the rest of the process.

    Raises:
        ValueError: the file defines no function of the assignment's name.
    """
    from .grading import ASSIGNMENTS, GradeReport, describe_error

    name, module_name = ASSIGNMENTS[assignment], f"wmtp_student_{assignment}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # the student's file is broken (or exits): a grade, not bad input
        return GradeReport(assignment, False, 0, f"{path} could not be imported: {describe_error(e, path)}")
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{path} defines no function {name}() (assignment {assignment!r})")
    return fn


def _child(assignment: str, path: str, result: str) -> None:
    from .grading import GraderError, grade_function

    sys.stdout.write(STARTED)  # the parent's time limit starts here (-u: written at once)

    def progress(n: int, case: str) -> None:  # the parent names this check if the file never returns from it
        with open(f"{result}.case", "w") as f:
            f.write(f"{n}\t{case}")

    try:
        loaded = load_student(assignment, Path(path))
        report = loaded if not callable(loaded) else grade_function(assignment, loaded, progress)
        out = asdict(report)
    except ValueError as e:
        out = {"error": "value", "message": str(e)}
    except GraderError as e:
        out = {"error": "grader", "message": str(e)}
    tmp = f"{result}.tmp"
    with open(tmp, "w") as f:  # whole or absent: the parent reads it only once renamed
        json.dump(out, f)
    os.replace(tmp, result)


if __name__ == "__main__":
    _child(*sys.argv[1:4])
