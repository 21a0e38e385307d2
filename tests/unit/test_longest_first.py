"""The suite's file order: longest first by measured cost, unknown files before all."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.longest_first import longest_first, read_costs, write_costs

pytestmark = pytest.mark.unit


def test_files_go_longest_first_and_unknown_ones_lead() -> None:
    costs = {"a.py": 1.0, "b.py": 30.0, "c.py": 5.0}
    assert longest_first(["a.py", "new.py", "b.py", "c.py", "newer.py"], costs) == [
        "new.py",
        "newer.py",
        "b.py",
        "c.py",
        "a.py",
    ]


def test_costs_round_trip_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "costs.txt"
    write_costs(path, {"tests/x.py": 2.5, "tests/y.py": 10.25})
    assert read_costs(path) == {"tests/x.py": 2.5, "tests/y.py": 10.25}
    assert path.read_text().splitlines()[1] == "10.25 tests/y.py"


def test_a_bad_line_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "costs.txt"
    path.write_text("1.0 tests/x.py\nfast tests/y.py\n")
    with pytest.raises(ValueError, match=r"costs.txt:2: expected 'seconds path'"):
        read_costs(path)


def test_the_committed_table_names_files_that_exist() -> None:
    """A renamed or deleted file left in the table would be a stale cost; regenerate it."""
    root = Path(__file__).resolve().parents[2]
    stale = [f for f in read_costs(root / "tests" / "file_costs.txt") if not (root / f).is_file()]
    assert not stale, f"tests/file_costs.txt names missing files {stale}: run `make file-costs`"
