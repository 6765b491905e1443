"""A role process that comes back: when it dies, or hangs, it is started again from its last
checkpoint, after a backoff, until its restart budget is spent. Both launchers supervise with
the same loop (`supervise_until_finished`) and the same budget; they differ only in how they
see and restart a role (a child process here, a Ray actor's in `launch/ray.py`).

A role hangs when its heartbeat file (`asyncrl.heartbeat`, beaten by a thread of the role)
stays silent for `restart.hang_timeout` seconds while the process is alive: it is stopped or
frozen, not slow. It is then killed with its process group (SIGKILL reaches a stopped process
too) and restarted like a role that died. Each restart is logged with the role, how it ended
and the end of its log; past the budget the run stops with `RoleFailed`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.config.restart import RestartConfig
from asyncrl.config.rl import RLConfig
from asyncrl.heartbeat import HEARTBEAT_ENV, clear_heartbeat, silent_for
from asyncrl.launch.live_view import LiveView
from asyncrl.launch.role_fork import can_fork_now, fork_role, role_command
from asyncrl.launch.roles import RoleFailed, reporter_for
from asyncrl.log import get_logger
from asyncrl.processes import ChildProcess, kill_group, start, tail
from asyncrl.run.layout import metrics_file

logger = get_logger(__name__)

CONFIG_ERROR = 2  # what `asyncrl <role>` exits with on a config error


@dataclass
class RoleSpec:
    name: str  # infer | orch | train
    command: list[str]
    restart_command: list[str]  # the same role, resuming from its last checkpoint
    log: Path
    heartbeat: Path
    env: dict[str, str] = field(default_factory=dict)
    finishes: bool = True  # a server (infer) runs until stopped: exiting at all is a failure
    cannot_restart: str | None = None  # why this role cannot be restarted in this config
    fork: bool = False  # forked from the launcher when it can be (`role_fork.py`), not exec'd
    # the run's secret and keys, handed over in memory or on a socket, never in `env`
    keys: dict[str, str] = field(default_factory=dict)


# what a restarted role is given on top of its first command: resume from its last checkpoint
RESUME_ARGUMENTS = {
    "infer": [],
    "orch": ["--ckpt.resume_step", "-1"],
    "train": ["--resume_step", "-1"],
}


def supervise_until_finished(config: RLConfig, check_roles: Callable[[], bool]) -> None:
    """Twice a second, until trainer and orchestrator have finished: `check_roles()` (it
    restarts a role that died or hung, raises `RoleFailed` for one past its budget, and says
    whether trainer and orchestrator have finished), then the live view and the trackers
    (`report_to`) read the run directory."""
    view = LiveView(metrics_file(config.orchestrator.output_dir), config.max_steps)
    reporter = reporter_for(config)
    try:
        with view:
            while True:
                finished = check_roles()
                view.refresh()
                if reporter is not None:
                    reporter.refresh()
                if finished:
                    logger.info("rl: trainer and orchestrator finished")
                    return
                time.sleep(0.5)
    finally:
        if reporter is not None:
            reporter.close()


def why_not_restartable(role: str, config: RLConfig) -> str | None:
    """What in the config keeps a role from being restarted alone (None: it can be)."""
    if role in ("orch", "train") and config.trainer.rollout_transport.type == "zmq":
        return "batches in a zmq queue die with it; `rollout_transport: filesystem` keeps them"
    return None


def how_it_ended(code: int) -> str:
    if code < 0:
        return f"exited with code {code} ({signal.Signals(-code).name})"
    return f"exited with code {code}"


class RestartBudget:
    """How many restarts a role has left and when the next may start; launchers share it (the
    local one per process, the Ray one per role, all trainer ranks counting as one)."""

    def __init__(self, what: str, policy: RestartConfig, cannot_restart: str | None = None):
        self.what, self.policy, self.cannot_restart = what, policy, cannot_restart
        self.restarts = 0

    def after_failure(self, ending: str, log: Path, now: float, code: int | None = None) -> float:
        """When to restart the role that ended so (`how_it_ended`, or a hang; `code` its exit
        code, None if it was killed for hanging); logs the restart. Raises `RoleFailed` with the
        end of its log when it may not be restarted."""
        what = f"{self.what} {ending}"
        if self.cannot_restart is not None and self.policy.max_restarts > 0:
            what += f" and cannot be restarted ({self.cannot_restart})"
        elif code == CONFIG_ERROR and self.policy.max_restarts > 0:
            what += " (a configuration error: a restart would meet it again)"
        elif self.restarts >= self.policy.max_restarts:
            if self.policy.max_restarts > 0:
                what += f" after {self.restarts} restart(s), the budget of restart.max_restarts"
        else:
            delay = self.policy.backoff * 2**self.restarts
            self.restarts += 1
            logger.warning(
                "rl: %s; restart %d of %d in %.0f s, from its last checkpoint. End of %s:\n%s",
                what, self.restarts, self.policy.max_restarts, delay, log, tail(log, 10),
            )  # fmt: skip
            return now + delay
        raise RoleFailed(f"{what}; end of {log}:\n{tail(log)}")

    def hung(self, silent: float | None) -> bool:
        """A live role whose heartbeat has been silent too long (None: no beat yet)."""
        timeout = self.policy.hang_timeout
        return timeout is not None and silent is not None and silent > timeout


class SupervisedRole:
    """One role's process and its restart bookkeeping; `check()` it a few times a second."""

    def __init__(self, spec: RoleSpec, policy: RestartConfig) -> None:
        self.spec = spec
        self.budget = RestartBudget(f"`asyncrl {spec.name}`", policy, spec.cannot_restart)
        self.restart_at: float | None = None
        self.finished = False
        self.process = self._start(spec.command)

    @property
    def restarts(self) -> int:
        return self.budget.restarts

    def _start(self, command: list[str]) -> ChildProcess:
        clear_heartbeat(self.spec.heartbeat)  # a new process (and its ranks) beats afresh
        env = {**self.spec.env, HEARTBEAT_ENV: str(self.spec.heartbeat)}
        if self.spec.fork and role_command(command) is not None and can_fork_now():
            return fork_role(command, self.spec.log, env, self.spec.keys)
        return start(command, self.spec.log, env, keys=self.spec.keys)

    def check(self, now: float | None = None) -> None:
        """Restart a role that died or hung (after its backoff); raise `RoleFailed` when it may
        not be restarted any more."""
        now = time.monotonic() if now is None else now
        if self.finished:
            return
        if self.restart_at is not None:
            if now >= self.restart_at:
                self.restart_at = None
                self.process = self._start(self.spec.restart_command)
            return
        code = self.process.poll()
        if code is None:
            silent = silent_for(self.spec.heartbeat)
            if not self.budget.hung(silent):
                return
            kill_group(self.process)
            ending = f"hung (no heartbeat for {silent:.0f} s) and was killed"
        elif code == 0 and self.spec.finishes:
            self.finished = True
            return
        else:
            ending = how_it_ended(code) if code else "stopped before training ended"
        self.restart_at = self.budget.after_failure(ending, self.spec.log, now, code)
