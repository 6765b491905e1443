"""Cores per role: the launcher splits the cores this process may use, each role pins itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asyncrl.cpu_affinity import CPUS_ENV, parse_cores, usable_cores
from asyncrl.launch.local import thread_budget


def test_core_lists_parse_and_bad_ones_name_the_variable() -> None:
    assert parse_cores("0,2-3") == {0, 2, 3}
    assert parse_cores("1") == {1}
    with pytest.raises(ValueError, match=CPUS_ENV):
        parse_cores("zero")


def test_disaggregated_roles_get_disjoint_halves_and_colocated_gets_every_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("asyncrl.launch.local.usable_cores", lambda: [0, 1, 2, 3])
    split = thread_budget(colocated=False)
    assert split["train"] == {"OMP_NUM_THREADS": "2", CPUS_ENV: "0,1"}
    assert split["infer"] == {"OMP_NUM_THREADS": "2", CPUS_ENV: "2,3"}
    assert CPUS_ENV not in split["orch"]  # light and bursty: anywhere
    assert thread_budget(colocated=True)["train"] == {"OMP_NUM_THREADS": "4"}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own setting wins
    assert thread_budget()["train"] == {}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux's")
def test_a_role_pins_itself_to_the_cores_it_is_given() -> None:
    core = usable_cores()[-1]
    script = (
        "import os, sys\n"
        "from asyncrl.cpu_affinity import apply_cpu_affinity\n"
        "apply_cpu_affinity()\n"
        "print(sorted(os.sched_getaffinity(0)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, CPUS_ENV: str(core)},
    )  # fmt: skip
    assert result.stdout.strip() == f"[{core}]"
