"""The course grader's verdicts (wmtp/grading.py, tutorials/assignments/): it passes every reference
solution, agrees with the library's own definitions, fails the unimplemented templates, and catches
each planted bug with a message naming the case; an answer in numpy or torch integers is an int, a
float is not."""

import ast

import pytest
import torch
from grading_helpers import ASSIGNMENTS, FILES, load_function
from grading_helpers import write_student as _write
from planted_bugs_01_06 import PLANTED_01_06
from planted_bugs_07_10 import ACCEPTED, PLANTED_07_10

from wmtp import grading
from wmtp.decode import verify_greedy
from wmtp.grading_batch import library_commit
from wmtp.grading_fork import library_fork
from wmtp.grading_paged import library_addresses
from wmtp.keyset import draft_key_indices, sink_query_position
from wmtp.kvcache import ring_slot
from wmtp.policy import best_depth

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_assignment_has_a_template_and_a_solution():
    assert set(FILES) == set(grading.ASSIGNMENTS)
    assert sorted(p.name for p in ASSIGNMENTS.glob("[0-9][0-9]_*.py")) == sorted(FILES.values())
    assert sorted(p.name for p in (ASSIGNMENTS / "solutions").glob("[0-9][0-9]_*.py")) == sorted(FILES.values())


@pytest.mark.parametrize("assignment", FILES)
def test_each_solution_states_its_templates_task_word_for_word(assignment):
    """A solution's docstring is its template's with "Reference solution to assignment NN" for its
    first words, so the task it solves is the one the grader checks (five had drifted: a rule the
    grader fails, and a check it runs first, were missing)."""
    template = ast.get_docstring(ast.parse((ASSIGNMENTS / FILES[assignment]).read_text()), clean=False)
    solution = ast.get_docstring(ast.parse((ASSIGNMENTS / "solutions" / FILES[assignment]).read_text()), clean=False)
    number = FILES[assignment][:2]
    assert template.startswith(f"Assignment {number}: ")
    assert solution == template.replace(f"Assignment {number}: ", f"Reference solution to assignment {number}: ", 1)


@pytest.mark.parametrize("assignment", FILES)
def test_reference_solution_passes(assignment):
    report = grading.grade(assignment, ASSIGNMENTS / "solutions" / FILES[assignment])
    assert report.passed, str(report)
    # rejection: 8 literal cases and 8 distributions of 20000 trials each; the others: 100s of cases
    assert report.first_failure is None and report.n_checks > (10 if assignment == "rejection" else 100)
    assert str(report).startswith(f"PASS {assignment}")


LIBRARY = {  # the library's own definitions, in the students' signatures
    "keyset": lambda t, n_sink, window: draft_key_indices(t, n_sink, window).tolist(),
    "ring_slot": ring_slot,
    "greedy_verify": lambda drafts, choice: verify_greedy(torch.tensor(drafts), torch.tensor(choice)),
    "reindexed": sink_query_position,
    "paged": library_addresses,
    "depth": best_depth,
    "fork": library_fork,
    "batch": library_commit,
}


@pytest.mark.parametrize("assignment", LIBRARY)
def test_literal_cases_agree_with_the_library(assignment):
    """The grader's literal expectations are the library's answers (and its oracles pass their own grader)."""
    report = grading.grade_function(assignment, LIBRARY[assignment])
    assert report.passed, str(report)


@pytest.mark.parametrize("assignment", FILES)
def test_template_fails_as_not_implemented(assignment):
    report = grading.grade(assignment, ASSIGNMENTS / FILES[assignment])
    assert not report.passed and report.n_checks == 1
    assert "not implemented yet" in report.first_failure and "not implemented yet" in str(report)


PLANTED = {**PLANTED_01_06, **PLANTED_07_10}


@pytest.mark.parametrize("bug", PLANTED)
def test_planted_bug_is_caught_with_the_failing_case(tmp_path, bug):
    """Graded in this process (0.02 s a bug, not 2 s for a child that imports torch): the child runs the
    same ``grade_function`` on the same file, which the next test checks for three of the bugs."""
    assignment, source, needles = PLANTED[bug]
    path = _write(tmp_path, source + (ACCEPTED if assignment == "batch" else ""))
    report = grading.grade_function(assignment, load_function(path, assignment))
    assert not report.passed
    for needle in needles:
        assert needle in report.first_failure, report.first_failure
    assert str(report).startswith(f"FAIL {assignment}")


@pytest.mark.parametrize("bug", ["depth that loops over the alphas", "batch committing lockstep's least match",
                                 "rejection that resamples p instead of the residual"])
def test_the_child_process_grades_a_planted_bug_as_this_process_does(tmp_path, bug):
    """A bug that raises (its message names the student's line), one graded with the batch assignment's
    accepted part, one of random draws: ``grade`` (a child process) reports what ``grade_function`` does."""
    assignment, source, _ = PLANTED[bug]
    path = _write(tmp_path, source + (ACCEPTED if assignment == "batch" else ""))
    assert grading.grade(assignment, path) == grading.grade_function(assignment, load_function(path, assignment))


@pytest.mark.parametrize("assignment, source", [
    ("depth", """
import numpy as np

def best_depth(alphas, costs):
    expected = 1 + np.cumsum(np.cumprod(alphas[: len(costs)]))
    return np.argmax(expected / np.asarray(costs)) + 1  # a numpy int: an int all the same
"""),
    ("paged", """
import numpy as np

def key_addresses(block_table, page_size, t, n_sink, window):
    start = 0 if window is None else max(0, t - window + 1)
    keys = np.array(sorted(set(range(min(n_sink, t + 1))) | set(range(start, t + 1))), dtype=np.int64)
    return list(zip(np.asarray(block_table)[keys // page_size], keys % page_size))
"""),
])
def test_numpy_integers_are_integers(tmp_path, assignment, source):
    report = grading.grade(assignment, _write(tmp_path, source))
    assert report.passed, report


def _solution(assignment):
    """The instructor's function of ``assignment``, imported in this process."""
    import importlib.util

    path = ASSIGNMENTS / "solutions" / FILES[assignment]
    spec = importlib.util.spec_from_file_location(f"solution_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, grading.ASSIGNMENTS[assignment])


@pytest.mark.parametrize("assignment", ["keyset", "ring_slot", "greedy_verify", "reindexed", "rejection"])
def test_numpy_integers_pass_every_int_grader(assignment):
    """A right answer in numpy ints (np.searchsorted, np.argmax, np.arange) is right: every grader
    that wants an int takes numpy's, as the depth and paged graders always did; a float still fails."""
    import numpy as np

    right = _solution(assignment)
    if assignment == "keyset":
        as_numpy = lambda *args: list(np.asarray(right(*args), dtype=np.int64))  # noqa: E731
        as_float = lambda *args: [float(k) for k in right(*args)]  # noqa: E731
    else:
        as_numpy = lambda *args: np.int64(right(*args))  # noqa: E731
        as_float = lambda *args: float(right(*args))  # noqa: E731
    report = grading.grade_function(assignment, as_numpy)
    assert report.passed, report
    report = grading.grade_function(assignment, as_float)
    assert not report.passed and "expected the" in report.first_failure, report


def test_as_int_takes_integers_only():
    import numpy as np

    from wmtp.grading_checks import as_int, to_int

    assert [as_int(x) for x in (3, np.int64(3), np.int32(-2), torch.tensor(4), torch.tensor(5, dtype=torch.int32))] == \
        [3, 3, -2, 4, 5]
    bad = (True, np.True_, torch.tensor(True), 3.0, np.float64(3), torch.tensor(3.0), torch.tensor([3]), "3", None)
    assert [as_int(x) for x in bad] == [None] * len(bad)
    assert to_int(np.int64(7)) == 7  # the paged, fork and batch graders read their pairs and rows through it
    for x in bad:
        with pytest.raises(TypeError, match="is not an int"):
            to_int(x)
