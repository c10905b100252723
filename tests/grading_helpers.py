"""What the grader test files (tests/test_grading_*.py) share: the course's assignments folder, the
file of each assignment, a student's file written from source, its function imported in this
process, and the first failure of a function graded in process. The bugs they plant are
tests/planted_bugs_01_06.py and tests/planted_bugs_07_10.py; their one-thread fixture is
tests/conftest.py's ``one_thread``."""

from pathlib import Path

from wmtp import grading

ASSIGNMENTS = Path(__file__).resolve().parents[1] / "tutorials" / "assignments"
FILES = {"keyset": "01_keyset.py", "ring_slot": "02_ring_slot.py", "greedy_verify": "03_greedy_verify.py",
         "splitk_merge": "04_splitk_merge.py", "reindexed": "05_reindexed_positions.py",
         "rejection": "06_rejection_sampling.py", "paged": "07_paged_keys.py", "depth": "08_draft_depth.py",
         "fork": "09_fork_table.py", "batch": "10_batch_commit.py"}


def write_student(tmp_path, source: str) -> Path:
    """``source`` after ``import torch``, as tmp_path/student.py."""
    path = tmp_path / "student.py"
    path.write_text("import torch\n\n" + source)
    return path


def load_function(path: Path, assignment: str):
    """The assignment's function from the file at ``path``, imported in this process under a module name
    of its own (the child process's ``load_student`` also puts the file's folder on ``sys.path``, which a
    test process should not keep)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"student_{assignment}", path)  # not put in sys.modules
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, grading.ASSIGNMENTS[assignment])


def first_failure(assignment: str, fn) -> str:
    """The first failure ``grading.grade_function`` reports for ``fn`` (which must fail)."""
    report = grading.grade_function(assignment, fn)
    assert not report.passed, report
    return report.first_failure
