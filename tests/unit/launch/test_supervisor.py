"""The restart policy on real short-lived processes: a role that dies is started again with its
restart command after the backoff, a stopped role is detected by its silent heartbeat, a config
error and a spent budget end the run, and a role that finishes is left alone."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from asyncrl.config.restart import RestartConfig
from asyncrl.launch.roles import RoleFailed
from asyncrl.launch.supervisor import RoleSpec, SupervisedRole


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def spec(tmp_path: Path, first: str, then: str = "import time; time.sleep(60)") -> RoleSpec:
    return RoleSpec("orch", python(first), python(then), tmp_path / "orch.log",
                    tmp_path / "orch.heartbeat")  # fmt: skip


def check_until(role: SupervisedRole, done: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline
        role.check()
        time.sleep(0.05)


def test_a_role_that_dies_is_restarted_with_its_restart_command_after_the_backoff(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "restarted"
    role = SupervisedRole(
        spec(tmp_path, "print('boom', flush=True); raise SystemExit(3)",
             f"open({str(marker)!r}, 'w').close()"),
        RestartConfig(max_restarts=2, backoff=0.5),
    )  # fmt: skip
    role.process.wait()
    died = time.monotonic()
    role.check()
    assert role.restarts == 1 and not marker.exists()
    check_until(role, lambda: role.finished)
    assert marker.exists() and time.monotonic() - died >= 0.5


def test_a_stopped_role_is_killed_once_its_heartbeat_is_silent(tmp_path: Path) -> None:
    beats = "from asyncrl.heartbeat import start_heartbeat; start_heartbeat(); import time; "
    role = SupervisedRole(
        spec(tmp_path, beats + "time.sleep(60)"),
        RestartConfig(max_restarts=1, backoff=0.0, hang_timeout=2.0),
    )
    check_until(role, lambda: role.spec.heartbeat.exists())
    first = role.process
    os.kill(first.pid, signal.SIGSTOP)
    started = time.monotonic()
    check_until(role, lambda: role.process is not first)
    assert first.returncode == -signal.SIGKILL and time.monotonic() - started >= 2.0
    role.process.kill()
    role.process.wait()


def test_a_config_error_is_not_restarted(tmp_path: Path) -> None:
    role = SupervisedRole(spec(tmp_path, "raise SystemExit(2)"), RestartConfig())
    role.process.wait()
    with pytest.raises(RoleFailed, match="a configuration error"):
        role.check()


def test_past_the_budget_the_role_fails_with_the_end_of_its_log(tmp_path: Path) -> None:
    dies = "print('out of memory', flush=True); raise SystemExit(1)"
    role = SupervisedRole(spec(tmp_path, dies, dies), RestartConfig(max_restarts=1, backoff=0))
    with pytest.raises(RoleFailed, match=r"after 1 restart\(s\)[\s\S]*out of memory"):
        check_until(role, lambda: False)


def test_a_server_that_exits_cleanly_is_restarted_too(tmp_path: Path) -> None:
    server = spec(tmp_path, "pass")
    server.finishes = False
    role = SupervisedRole(server, RestartConfig(max_restarts=1, backoff=0))
    role.process.wait()
    role.check()
    assert role.restarts == 1 and not role.finished
    role.check()
    role.process.kill()
    role.process.wait()
