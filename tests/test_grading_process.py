"""How the course grader runs a student's file (wmtp/grading_process.py): in a process of its own,
where a crash names its case, an exit, an endless loop or an edit of the grader is a failed grade,
what the file prints is shown cut to its first and last lines, a file that does not import fails,
and a file may use dataclasses and a helper beside it. Bad input is a ValueError, and
``wmtp grade`` exits 0, 1 or 2."""

import os

import pytest
from grading_helpers import ASSIGNMENTS
from grading_helpers import write_student as _write

from wmtp import grading, grading_process
from wmtp.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_crash_in_the_student_function_names_the_case(tmp_path):
    crash = _write(tmp_path, "def ring_slot(p, n_sink, window, depth):\n    return [][p]\n")
    report = grading.grade("ring_slot", crash)
    assert not report.passed
    assert report.first_failure.startswith("ring_slot(p=0, n_sink=4, window=6, depth=2): raised IndexError")
    assert report.first_failure.endswith("(student.py, line 4)")  # where, in the student's file


@pytest.mark.parametrize("body, why", [
    ("def ring_slot(p, n_sink, window, depth):\n    assert p < 0\n", "raised AssertionError (student.py, line 5)"),
    ("def ring_slot(p, n_sink, window, depth):\n    return helper.slot(p)\n",
     "raised ValueError: first line ... (helper.py, line 2)"),
    ("helper.slot(0)\n", "could not be imported: ValueError: first line ... (helper.py, line 2)"),
])
def test_an_error_is_one_line_naming_where_the_student_raised_it(tmp_path, body, why):
    """A bare assert, or a message of many lines, is reported on one line that ends with the file and
    line where the student's code (the file, or a helper beside it) raised it: no traceback."""
    (tmp_path / "helper.py").write_text("def slot(p):\n    raise ValueError('first line\\nsecond line')\n")
    report = grading.grade("ring_slot", _write(tmp_path, "import helper\n" + body))
    assert not report.passed and report.first_failure.endswith(why) and "\n" not in report.first_failure, report


@pytest.mark.parametrize("body", ["def ring_slot(p, n_sink, window, depth):\n    raise SystemExit(0)\n",
                                  "raise SystemExit(3)\n"])
def test_exiting_is_a_failed_grade_not_a_pass(tmp_path, body):
    """``SystemExit(0)`` from the student's function or module must not end the grader with status 0."""
    report = grading.grade("ring_slot", _write(tmp_path, body))
    assert not report.passed and "SystemExit" in report.first_failure


KEYS = """
def draft_key_indices(t, n_sink, window):
    sinks = range(min(n_sink, t + 1))
    recent = range(0 if window is None else max(n_sink, t - window + 1), t + 1)
    return sorted(set(sinks) | set(recent))
"""


def test_a_correct_file_may_use_dataclasses_and_a_helper_beside_it(tmp_path):
    """The file is a module in sys.modules while it runs (dataclasses need it), its folder on sys.path."""
    (tmp_path / "keyhelper.py").write_text(KEYS)
    path = tmp_path / "student.py"
    path.write_text("from __future__ import annotations\nfrom dataclasses import dataclass\n\nimport keyhelper\n\n\n"
                    "@dataclass\nclass Query:\n    t: int\n\n\n"
                    "def draft_key_indices(t, n_sink, window):\n"
                    "    return keyhelper.draft_key_indices(Query(t).t, n_sink, window)\n")
    report = grading.grade("keyset", path)
    assert report.passed, report


@pytest.mark.parametrize("body, why", [
    ("import os\nos._exit(0)\n", "ended the grading process (exit status 0)"),  # not a silent pass
    ("while True:\n    pass\n", "took longer than 10 s"),
    ("import wmtp.grading_checks as g\ng.N_FUZZ = 0\ng.KEYSET_LITERAL.clear()\n", "of the 310 checks ran"),
])
def test_a_file_that_exits_loops_or_edits_the_grader_fails(tmp_path, body, why):
    report = grading.grade("keyset", _write(tmp_path, KEYS + body), timeout_s=10)
    assert not report.passed and why in report.first_failure, report


@pytest.mark.parametrize("stop, why", [("while True:\n            pass", "took longer than 5 s on "),
                                       ("import os\n        os._exit(0)", "(exit status 0) on ")])
def test_a_function_that_never_returns_names_the_check_it_was_on(tmp_path, stop, why):
    """A loop (or a hard exit) inside the graded function, at its fourth check: the grade names that
    check, as a crash there would, not check 0 and the file alone."""
    body = KEYS.replace("    sinks = ", f"    if t == 9 and n_sink == 4:\n        {stop}\n    sinks = ")
    report = grading.grade("keyset", _write(tmp_path, body), timeout_s=5)
    assert not report.passed and report.n_checks == 4, report
    assert why + "draft_key_indices(t=9, n_sink=4, window=6)" in report.first_failure, report


def test_what_a_file_prints_is_shown_cut_to_its_first_and_last_lines(tmp_path, capsys, monkeypatch):
    """A print in the graded function runs once a check (310 for the key set): the student sees the
    first SHOWN_LINES lines, a count of the cut ones and the last TAIL_LINES, on stderr, and the grade is
    the function's. A file that prints in an endless loop still times out, its output cut the same way;
    what a file prints before it hangs or hard-exits is shown, even with output buffered (no
    PYTHONUNBUFFERED: a pipe's block buffer would have kept it). The 2 s limits count from the child's
    start: with loading counted (torch), an H100 run of the suite in 16 workers saw no line in 5 s."""
    first, last = grading_process.SHOWN_LINES, grading_process.TAIL_LINES
    printing = KEYS.replace("    sinks = ", "    print('called with', t, n_sink, window)\n    sinks = ")
    report = grading.grade("keyset", _write(tmp_path, printing), timeout_s=60)
    err = capsys.readouterr().err.splitlines()
    assert report.passed, report
    assert err[0] == "output while grading student.py:" and len(err) == 1 + first + 1 + last
    assert all(line.startswith("  | called with ") for line in err[1:first + 1] + err[-last:])
    assert err[first + 1] == f"  ({report.n_checks - first - last} more lines)"  # one print a check
    report = grading.grade("keyset", _write(tmp_path, KEYS + "while True:\n    print('x' * 2999)\n"), timeout_s=2)
    err = capsys.readouterr().err.splitlines()  # 2 s from the child's start: loading (torch) is not counted
    assert not report.passed and "took longer than 2 s" in report.first_failure
    assert err[1:4] == ["  | " + "x" * 1000] * 2 + ["  | " + "x" * 999]  # a long line shown 1000 bytes at a time
    assert len(err) == 1 + first + 1 + last and err[first + 1].endswith(" more lines)")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    hang, hard_exit = ("while True:\n    pass\n", "took longer than 2 s"), ("import os\nos._exit(3)\n", "exit status 3")
    for body, why in (hang, hard_exit):
        report = grading.grade("keyset", _write(tmp_path, KEYS + "print('loading')\nprint('step 2')\n" + body),
                               timeout_s=2)
        err = capsys.readouterr().err.splitlines()
        assert not report.passed and why in report.first_failure, report
        assert err == ["output while grading student.py:", "  | loading", "  | step 2"]


def test_the_time_limit_starts_once_the_child_has_loaded(tmp_path, capsys, monkeypatch):
    """A child slow to load (a sitecustomize that sleeps 3 s, as torch's import can on a busy machine)
    still gives the student's file its 2 s: the endless loop's lines are shown before the time out."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text("import time\ntime.sleep(3)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(slow), *filter(None, [os.environ.get("PYTHONPATH")])]))
    report = grading.grade("keyset", _write(tmp_path, KEYS + "while True:\n    print('still here')\n"), timeout_s=2)
    err = capsys.readouterr().err.splitlines()
    assert not report.passed and "took longer than 2 s" in report.first_failure
    assert err[0] == "output while grading student.py:" and err[1] == "  | still here", err[:3]


def test_a_file_that_does_not_import_is_a_failed_grade(tmp_path):
    report = grading.grade("keyset", _write(tmp_path, "def draft_key_indices(t, n_sink, window)\n"))
    assert not report.passed and "could not be imported: SyntaxError" in report.first_failure
    assert str(report).startswith("FAIL keyset: ")  # no "(check 0)": no check ran


def test_a_syntax_error_graded_from_its_own_folder_names_no_frozen_frame(tmp_path, capsys, monkeypatch):
    """``cd folder && wmtp grade keyset bug.py``: the import's frames in ``<frozen importlib._bootstrap>``
    resolved into the current folder, the student's, and the report ended "(<frozen importlib._bootstrap>,
    line 241)"; the SyntaxError's own "(bug.py, line 1)" is where the mistake is."""
    (tmp_path / "bug.py").write_text("def f(:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    assert main(["grade", "keyset", "bug.py"]) == 1
    out = capsys.readouterr().out
    assert "could not be imported: SyntaxError: " in out and out.endswith(" (bug.py, line 1)\n"), out
    with pytest.raises(ValueError) as raised:  # a frame of no file, ``<string>``'s, beside a relative "bug.py"
        exec(compile("raise ValueError('x')", "<string>", "exec"))
    assert grading.describe_error(raised.value, "bug.py") == "ValueError: x"


def test_a_relative_student_file_is_its_folder_resolved(tmp_path, monkeypatch):
    """``describe_error`` called with a relative name (mutation round 15): the folder compared with the
    frames' (resolved) folders is the name's resolved one, so the line raised in a file beside it is
    named (compared with ".", no frame was the student's)."""
    helper = tmp_path / "helper.py"
    namespace = {}
    exec(compile("def slot(p):\n    raise ValueError('x')\n", str(helper), "exec"), namespace)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as raised:
        namespace["slot"](0)
    assert grading.describe_error(raised.value, "student.py") == "ValueError: x (helper.py, line 2)"


def test_bad_input_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        grading.grade("keyset", tmp_path / "missing.py")
    with pytest.raises(ValueError, match="is a folder: pass the student's .py file"):
        grading.grade("keyset", tmp_path)
    with pytest.raises(ValueError, match=r"defines no function draft_key_indices\(\)"):
        grading.grade("keyset", _write(tmp_path, "def keys(t, n_sink, window):\n    return []\n"))
    (tmp_path / "notes.txt").write_text("def draft_key_indices(t, n_sink, window):\n    return []\n")
    with pytest.raises(ValueError, match="not a Python file"):
        grading.grade("keyset", tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="unknown assignment 'kv'"):
        grading.grade("kv", ASSIGNMENTS / "solutions" / "01_keyset.py")


@pytest.mark.parametrize("timeout_s", [0, -1, float("nan"), float("inf"), "10", True, None])
def test_a_time_limit_that_is_not_a_finite_positive_number_is_bad_input(timeout_s):
    """Refused before any child starts: 0 used to fail every file as "took longer than 0 s", and "10"
    raised a TypeError inside subprocess."""
    with pytest.raises(ValueError, match=r"^timeout_s must be a finite number > 0, got "):
        grading.grade("keyset", ASSIGNMENTS / "solutions" / "01_keyset.py", timeout_s=timeout_s)


def test_cli_exit_codes(capsys, tmp_path):
    assert main(["grade", "splitk_merge", str(ASSIGNMENTS / "solutions" / "04_splitk_merge.py")]) == 0
    assert "PASS splitk_merge" in capsys.readouterr().out
    bug = _write(tmp_path, "def accept_count(drafts, target_choice):\n    return len(drafts)\n")
    assert main(["grade", "greedy_verify", str(bug)]) == 1
    out = capsys.readouterr().out
    assert "FAIL greedy_verify" in out and "accept_count(drafts=[1, 2, 3], target_choice=[1, 2, 4, 0])" in out
    assert main(["grade", "keyset", str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["grade", "kv", str(bug)]) == 2
    assert "invalid choice" in capsys.readouterr().err


# Mutation round 7 (part c): each test below failed on a mutant of grading.py or grading_process.py
# that survived the tests above.
def test_report_and_error_text_literal():
    assert str(grading.GradeReport("keyset", True, 310)) == "PASS keyset: all 310 checks passed."
    assert grading.describe_error(ValueError("one line"), None) == "ValueError: one line"  # no " ...": nothing cut
    assert grading.describe_error(AssertionError(), None) == "AssertionError"


def test_the_template_as_handed_out_is_told_what_to_replace():
    def draft_key_indices(t, n_sink, window):
        raise NotImplementedError

    assert grading.grade_function("keyset", draft_key_indices).first_failure == (
        "draft_key_indices is not implemented yet (it raised NotImplementedError on draft_key_indices(t=19, n_sink=2, "
        "window=6)): replace `raise NotImplementedError` with your code.")


def test_a_file_that_drops_one_case_fails_and_a_non_function_is_bad_input(tmp_path):
    drops_one = KEYS + "import wmtp.grading_checks as g\ng.KEYSET_LITERAL.pop()\n"
    report = grading.grade("keyset", _write(tmp_path, drops_one))
    assert str(report) == "FAIL keyset (check 309): only 309 of the 310 checks ran: the file changed the grader's cases"
    with pytest.raises(ValueError, match=r"defines no function draft_key_indices\(\) \(assignment 'keyset'\)$"):
        grading.grade("keyset", _write(tmp_path, "draft_key_indices = 3\n"))


def test_a_helper_beside_the_file_comes_before_a_library_module_of_its_name(tmp_path):
    """The file's folder is first on sys.path: its colorsys.py, not the standard library's."""
    (tmp_path / "colorsys.py").write_text(KEYS)
    report = grading.grade("keyset", _write(tmp_path, "from colorsys import draft_key_indices  # noqa: F401\n"))
    assert report.passed, report


def test_a_file_that_prints_the_childs_started_line_is_shown_it(tmp_path, capsys):
    """Only the child's own first line is taken as its start: the same text printed by the file is shown."""
    report = grading.grade("keyset", _write(tmp_path, KEYS + f"print({grading_process.STARTED!r}, end='')\n"))
    assert report.passed, report
    assert capsys.readouterr().err.splitlines() == [
        "output while grading student.py:", "  | wmtp.grading_process: loaded, importing the student's file"]


def test_a_case_record_cut_short_names_no_check(tmp_path):
    record = tmp_path / "report.json.case"
    assert grading_process._last_check(record) == {}  # none started
    for cut in ("4", "\t", "4x\tcase"):  # a kill mid-write
        record.write_text(cut)
        assert grading_process._last_check(record) == {}, cut
    record.write_text("4\tdraft_key_indices(t=9")
    assert grading_process._last_check(record) == {"check": 4, "case": "draft_key_indices(t=9"}
