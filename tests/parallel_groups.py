"""A pytest plugin: how `make test` shares the suite between two workers (pytest-xdist).

Much of the suite's wall time is spent waiting (servers and roles starting, restarts, polls),
so two workers on two cores finish it in less time than one. Two rules keep that safe and short:

- **Tests that share something expensive run on one worker, in their usual order**: each module
  is one group (its module-scoped servers start once); the engine contract's modules, which
  share session-scoped servers (`engine` in tests/contract/conftest.py), are one group; the Ray
  modules, which each start a local Ray instance, are one group.
- **The longest groups start first** (by `usual_durations.json`), so the run does not end with
  one worker finishing a long group while the other sits idle: the longest-first rule of
  scheduling jobs on parallel machines.

Tests marked `solo` (CPU-bound and statistical: the reverse-text quick start's learning test
took 2-4x its time beside another worker) are left out of this run and run after it, alone (the
Makefile).

`--dist loadgroup` (the Makefile's `test`) turns both on: the workers order their collection
and the controller hands out whole groups in that order. xdist's own `xdist_group` marks do not
reach its scheduler under pytest 9 (it renames `item._nodeid`, which pytest 9 no longer reads),
so the scheduler here groups by the test's id. Without `-n` the order is the files' own.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
from tests.usual_durations import USUAL

SHARED = {
    "tests/contract/test_generation.py": "engine-contract",
    "tests/contract/test_weights_and_pause.py": "engine-contract",
    "tests/integration/launch/test_rl_ray.py": "ray",
    "tests/integration/launch/test_rl_ray_auth.py": "ray",
}
UNKNOWN_S = 5.0  # a test with no recorded time (new since the last recording) counts as this


def group_of(nodeid: str) -> str:
    """The group a test runs in (one worker runs a whole group, in collection order)."""
    module = nodeid.split("::", 1)[0]
    return SHARED.get(module, module)


def longest_groups_first(nodeids: list[str], usual: dict[str, float]) -> list[int]:
    """The positions of `nodeids` reordered group by group, the longest group first (by its
    usual total time); within a group the order pytest chose, which keeps session and module
    fixtures shared."""
    total: defaultdict[str, float] = defaultdict(float)
    first_seen: dict[str, int] = {}
    for index, nodeid in enumerate(nodeids):
        group = group_of(nodeid)
        total[group] += usual.get(nodeid, UNKNOWN_S)
        first_seen.setdefault(group, index)

    def rank(index: int) -> tuple[float, int, int]:
        group = group_of(nodeids[index])
        return -total[group], first_seen[group], index

    return sorted(range(len(nodeids)), key=rank)


def _loadgroup_worker(config: pytest.Config) -> bool:
    """An xdist worker of a `--dist loadgroup` run (xdist sets a worker's own `dist` to "no"
    and keeps the mode in `loadgroup`)."""
    return bool(getattr(config.option, "loadgroup", False))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After pytest has ordered the tests for its fixtures: the longest groups first."""
    if _loadgroup_worker(config):
        usual = json.loads(USUAL.read_text()) if USUAL.exists() else {}
        order = longest_groups_first([item.nodeid for item in items], usual)
        items[:] = [items[index] for index in order]


@pytest.hookimpl(optionalhook=True)  # an xdist hook: inert where xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The controller's scheduler for `--dist loadgroup`: whole groups by `group_of`, handed
    out in the workers' order (not xdist's largest-count-first reordering of scopes)."""
    if config.getoption("dist") != "loadgroup":
        return None
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
