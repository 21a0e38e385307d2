"""The suite's files in the order that ends soonest on two workers: longest first.

`--dist loadfile` keeps a file on one worker, and a worker takes the next file when it is
done, so the run ends when the last long file does. Sent in collection order, a long
integration file can start last and leave the other worker idle for a minute; sent longest
first (each file's time measured in an earlier run, `tests/file_costs.txt`), the short files
fill the end. A file the table does not know yet goes first: its cost is unknown, and a short
one costs nothing there. `make file-costs` measures the table again.

Loaded by tests/conftest.py; the order applies where the run asks for it (`--longest-first`,
which the Makefile passes with xdist's `--no-loadscope-reorder`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

COSTS_FILE = Path(__file__).with_name("file_costs.txt")


def read_costs(path: Path) -> dict[str, float]:
    """`seconds path` per line, as `write_costs` writes it."""
    costs: dict[str, float] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            seconds, file = line.split()
            costs[file] = float(seconds)
        except ValueError:
            raise ValueError(f"{path}:{number}: expected 'seconds path', got {line!r}") from None
    return costs


def longest_first(files: list[str], costs: dict[str, float]) -> list[str]:
    """`files` longest first; the ones without a cost before all others, in their order."""
    return sorted(files, key=lambda file: -costs.get(file, float("inf")))


def write_costs(path: Path, costs: dict[str, float]) -> None:
    lines = [
        f"{seconds:.2f} {file}" for file, seconds in sorted(costs.items(), key=lambda c: -c[1])
    ]
    header = "# seconds per test file (setup + call + teardown), measured by `make file-costs`\n"
    path.write_text(header + "\n".join(lines) + "\n")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hybrid")
    group.addoption(
        "--longest-first",
        action="store_true",
        help=f"run the test files longest first, by the times in {COSTS_FILE.name}",
    )
    group.addoption(
        "--record-file-costs",
        metavar="PATH",
        help="write each test file's measured seconds to PATH when the run ends",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("longest_first") or not COSTS_FILE.exists():
        return
    by_file: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_file[item.nodeid.split("::")[0]].append(item)
    order = longest_first(list(by_file), read_costs(COSTS_FILE))
    items[:] = [item for file in order for item in by_file[file]]


class CostRecorder:
    """Sums every phase's duration per file, on the process that sees all reports (the xdist
    controller, or the one process of a run without xdist)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.costs: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.costs[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self) -> None:
        write_costs(self.path, self.costs)


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("record_file_costs")
    if path and not hasattr(config, "workerinput"):  # not on an xdist worker
        config.pluginmanager.register(CostRecorder(Path(path)), "hybrid-cost-recorder")
