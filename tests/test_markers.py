"""The ``needs_datasets`` mark (tests/conftest.py, pyproject.toml): the tests that read a WikiText
folder through `datasets`, which the device runs deselect with ``-m "not needs_datasets"``
(docs/results/gpu-attention.md). It must mark exactly the users of the ``wikitext_dir`` fixture and
the one test that writes its own folder; a test marked by mistake would silently never run there."""

from types import SimpleNamespace

from conftest import pytest_collection_modifyitems

OWN_FOLDER = "tests/test_cli_late_checks.py::test_a_short_test_split_is_refused_before_the_training"


def test_conftest_marks_the_users_of_wikitext_dir():
    marks = []
    items = [SimpleNamespace(fixturenames=names, add_marker=lambda m, i=i: marks.append((i, m)))
             for i, names in enumerate([("tmp_path", "wikitext_dir"), ("tmp_path",), (), ("wikitext_dirs",)])]
    pytest_collection_modifyitems([*items, SimpleNamespace()])  # an item without fixtures (a doctest's) is left
    assert marks == [(0, "needs_datasets")]


def test_the_marked_tests_are_the_users_of_wikitext_dir_and_one_more(request):
    """Over whatever part of the suite this run collected (all of it in CI; deselected tests are gone)."""
    import test_cli_late_checks

    assert [m.name for m in test_cli_late_checks.test_a_short_test_split_is_refused_before_the_training.pytestmark] \
        == ["needs_datasets"]
    items = request.session.items
    marked = [i.nodeid for i in items if i.get_closest_marker("needs_datasets")]
    assert marked == [i.nodeid for i in items if "wikitext_dir" in getattr(i, "fixturenames", ()) or
                      i.nodeid == OWN_FOLDER]
