"""The course grader: check a student's function against the library's oracles (``wmtp grade``).

Ten assignments (tutorials/assignments/), each a core piece of Windowed-MTP (arXiv 2607.21535):

- ``keyset``, ``draft_key_indices``: literal key sets, then ``wmtp.keyset`` on fuzzed cases;
- ``ring_slot``, ``ring_slot``: literal slots, ``wmtp.kvcache.ring_slot`` on fuzzed cases, and a
  simulation proving no read lands on an overwritten slot;
- ``greedy_verify``, ``accept_count``: literal cases, ``wmtp.decode.verify_greedy`` on fuzzed cases,
  and the oracle-draft lossless harness (speculative output == dense greedy output);
- ``splitk_merge``, ``merge_splits``: ``softmax(s) @ v`` over all keys, in float64;
- ``reindexed``, ``sink_query_position``: literal positions, ``wmtp.keyset`` on fuzzed cases, and
  attention against the compact re-indexed cache (wmtp/grading_reindex.py);
- ``rejection``, ``verify_one``: speculative sampling's rule for one draft, a repeated call (one
  answer), literal cases and the committed tokens' distribution against ``p`` over seeded trials
  (wmtp/grading_rejection.py);
- ``paged``, ``key_addresses``: the (page, row) of every key of the key set in a paged cache,
  literal and fuzzed cases, and attention over the keys read there (wmtp/grading_paged.py);
- ``depth``, ``best_depth``: the draft depth with the most expected tokens per unit of cost,
  literal and fuzzed cases, and simulated steps at every depth (wmtp/grading_depth.py);
- ``fork``, ``fork_table``: a run's block table sharing a prompt's pages (copy on write), literal
  and fuzzed cases, and two runs forked from one prompt in a pool of pages (wmtp/grading_fork.py);
- ``batch``, ``commit_rows``: what each row of a batch at its own positions commits after one
  verify pass, literal and fuzzed cases, and prompts of different lengths decoded as one batch
  (wmtp/grading_batch.py).

The checks live in wmtp/grading_checks.py (01-04), grading_reindex.py (05),
grading_rejection.py (06), grading_paged.py (07), grading_depth.py (08), grading_fork.py (09) and
grading_batch.py (10); this module registers and runs them. Checks run in order (literal cases
first, so the first failure is a readable one) and stop at the first failure, which the report
names: the call, what was expected and what came back (an exception: one line, with the file and line of
the student's code that raised it, ``describe_error``). An int answer may be numpy's
(``grading_checks.as_int``); fork and batch pass copies of their arguments and fail a function
that changes them. ``grade`` runs the checks on a student's file in a child process with a time
limit (wmtp/grading_process.py); ``grade_function`` runs them on a function in this one.

The lossless harness passes the student's ``accept_count`` to ``speculative_generate`` as its
``verifier`` (a function with ``verify_greedy``'s signature), wrapped to count calls and to check
the value it returns.
"""

from __future__ import annotations

import importlib.util
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from . import grading_process
from .checks import check_number
from .grading_batch import batch_checks
from .grading_checks import (  # noqa: F401  (OracleDraft, harness_models, ...: the tests' names, as before the split)
    N_FUZZ,
    RING_SIMULATED,
    Check,
    GraderError,
    OracleDraft,
    harness_models,
    keyset_checks,
    lossless_harness,
    ring_checks,
    ring_no_evicted_read,
    verify_checks,
)
from .grading_depth import depth_checks
from .grading_fork import fork_checks
from .grading_merge import merge_checks
from .grading_paged import paged_checks
from .grading_reindex import reindex_checks
from .grading_rejection import rejection_checks

ASSIGNMENTS = {"keyset": "draft_key_indices", "ring_slot": "ring_slot", "greedy_verify": "accept_count",
               "splitk_merge": "merge_splits", "reindexed": "sink_query_position", "rejection": "verify_one",
               "paged": "key_addresses", "depth": "best_depth", "fork": "fork_table",
               "batch": "commit_rows"}
TIMEOUT_S = 300.0  # a whole assignment's checks take seconds; a student's endless loop must not hang the grader


@dataclass
class GradeReport:
    """Outcome of grading one assignment: ``first_failure`` names the case, expected and got."""

    assignment: str
    passed: bool
    n_checks: int
    first_failure: str | None = None

    def __str__(self) -> str:
        at = f" (check {self.n_checks})" if self.n_checks else ""  # 0: before any check (an import that failed)
        return (f"PASS {self.assignment}: all {self.n_checks} checks passed." if self.passed else
                f"FAIL {self.assignment}{at}: {self.first_failure}")


def grade(assignment: str, path: str | Path, *, timeout_s: float = TIMEOUT_S) -> GradeReport:
    """Grade the student's file in a child process (wmtp/grading_process.py), at most ``timeout_s``
    seconds once the child has loaded (Python, torch, the grader): a file that loops, hard-exits or
    changes the grader's checks gets a failed grade.

    Raises:
        ValueError: unknown assignment, a ``timeout_s`` that is not a finite number > 0, missing
            file, or a file without the assignment's function.
        GraderError: the grader is out of date with the library.
    """
    _function_name(assignment)
    check_number("timeout_s", timeout_s, positive=True)  # 0 would fail every file as too slow; "10" a TypeError
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is a folder: pass the student's .py file" if path.is_dir()
                         else f"no such file: {path}")
    if importlib.util.spec_from_file_location("wmtp_student_probe", path) is None:
        raise ValueError(f"{path} is not a Python file")
    expected = sum(1 for _ in CHECKS[assignment](None))  # the thunks are not called: only counted
    out = grading_process.run(assignment, path.resolve(), timeout_s)
    if "error" in out:
        raise (ValueError if out["error"] == "value" else GraderError)(out["message"])
    n, on = out.get("check", 0), f" on {out['case']}" if "case" in out else ""  # the check running at the end
    if "timeout" in out:
        return GradeReport(assignment, False, n, f"grading {path} took longer than {timeout_s:g} s{on} (a loop that "
                           "never ends?)")
    if "no_report" in out:
        return GradeReport(assignment, False, n, f"{path} ended the grading process (exit status "
                           f"{out['no_report']}){on} before it could report")
    report = GradeReport(**out)
    if report.passed and report.n_checks != expected:
        return GradeReport(assignment, False, report.n_checks, f"only {report.n_checks} of the {expected} checks "
                           "ran: the file changed the grader's cases")
    return report


def grade_function(assignment: str, fn: Callable, progress: Callable[[int, str], None] | None = None) -> GradeReport:
    """Run the assignment's checks on ``fn`` in order, stopping at the first failure; ``progress(n, case)``,
    if given, is told each check before it runs (the child process records it for a time out)."""
    name = _function_name(assignment)
    n = 0
    for n, (case, check) in enumerate(CHECKS[assignment](fn), start=1):
        if progress is not None:
            progress(n, case)
        try:
            why = check()
        except GraderError:
            raise
        except NotImplementedError:
            return GradeReport(assignment, False, n, f"{name} is not implemented yet (it raised NotImplementedError "
                               f"on {case}): replace `raise NotImplementedError` with your code.")
        except (Exception, SystemExit) as e:  # SystemExit(0) must not end the grader as a pass
            why = f"raised {describe_error(e, getattr(getattr(fn, '__code__', None), 'co_filename', None))}"
        if why is not None:
            return GradeReport(assignment, False, n, f"{case}: {why}")
    return GradeReport(assignment, True, n)


def describe_error(e: BaseException, student_file: str | Path | None) -> str:
    """``e`` in one line, ``Type: first line of its message``, and where it was raised in the student's
    code: the deepest frame in a file of ``student_file``'s folder (the file or a helper beside it),
    as ``(file, line n)``. A bare ``assert`` or a message of many lines still names the line. Frames of
    no file (``<frozen importlib._bootstrap>``, ``<string>``) are never the student's, wherever the
    folder is (a relative name resolves into the current one)."""
    lines = str(e).strip().splitlines()
    text = type(e).__name__ + (f": {lines[0]}" + (" ..." if len(lines) > 1 else "") if lines else "")
    if student_file is None:
        return text
    folder = Path(student_file).resolve().parent
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith("<") and Path(f.filename).resolve().parent == folder]
    return text + (f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else "")


def _function_name(assignment: str) -> str:
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"unknown assignment {assignment!r}; choose one of {', '.join(ASSIGNMENTS)}")
    return ASSIGNMENTS[assignment]


CHECKS: dict[str, Callable[[Callable], Iterator[Check]]] = {"keyset": keyset_checks, "ring_slot": ring_checks,
                                                             "greedy_verify": verify_checks,
                                                             "splitk_merge": merge_checks,
                                                             "reindexed": lambda fn: reindex_checks(fn, N_FUZZ),
                                                             "rejection": rejection_checks,
                                                             "paged": lambda fn: paged_checks(fn, N_FUZZ),
                                                             "depth": lambda fn: depth_checks(fn, N_FUZZ),
                                                             "fork": lambda fn: fork_checks(fn, N_FUZZ),
                                                             "batch": lambda fn: batch_checks(fn, N_FUZZ)}
