"""A pytest plugin: the end of every run says which tests took longest, and which took far
longer than they usually do — the first sign of a test that waits on something it should not.

"Usually" is `tests/usual_durations.json` (seconds per test, setup and teardown included),
written by `pytest --record-durations` on a quiet machine. Machines differ in speed, so each
test is judged against the pace of this run: the median ratio of observed to usual time over
the tests that usually take a second or more. A test is slower than usual when it took more
than twice its usual time at that pace, and at least 10 s more.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

USUAL = Path(__file__).with_name("usual_durations.json")
JUDGED_FROM_S = 1.0  # shorter tests are noise
SHOWN = 5

_observed: defaultdict[str, float] = defaultdict(float)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations", action="store_true",
        help=f"write this run's test durations to {USUAL.name} as the usual ones",
    )  # fmt: skip


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _observed[report.nodeid] += report.duration


def slower_than_usual(
    observed: dict[str, float], usual: dict[str, float]
) -> tuple[float, list[tuple[str, float, float]]]:
    """This run's pace against the usual times, and the tests far behind it (slowest first)."""
    ratios = [
        seconds / usual[test]
        for test, seconds in observed.items()
        if usual.get(test, 0.0) >= JUDGED_FROM_S
    ]
    pace = statistics.median(ratios) if ratios else 1.0
    late = [
        (test, seconds, usual[test])
        for test, seconds in observed.items()
        if usual.get(test, 0.0) >= JUDGED_FROM_S
        and seconds > max(2.0 * pace * usual[test], pace * usual[test] + 10.0)
    ]
    return pace, sorted(late, key=lambda row: row[1] - pace * row[2], reverse=True)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    if not _observed or hasattr(config, "workerinput"):  # an xdist worker: the controller says it
        return
    usual = json.loads(USUAL.read_text()) if USUAL.exists() else {}
    slowest = sorted(_observed.items(), key=lambda item: item[1], reverse=True)[:SHOWN]
    write = terminalreporter.write_line
    write("slowest: " + ", ".join(f"{test} {seconds:.0f} s" for test, seconds in slowest))
    pace, late = slower_than_usual(dict(_observed), usual)
    listed = ", ".join(
        f"{test} {seconds:.0f} s (usually {expected:.0f} s)" for test, seconds, expected in late
    )
    write(
        f"slower than usual (this run's pace: {pace:.2f}x the recorded times): {listed or 'none'}"
    )
    if config.getoption("record_durations"):  # merged: `make test` runs pytest twice (solo)
        observed = {test: round(seconds, 2) for test, seconds in _observed.items()}
        recorded = dict(sorted((usual | observed).items()))
        USUAL.write_text(json.dumps(recorded, indent=0) + "\n")
        write(f"recorded {len(observed)} durations in {USUAL}")
