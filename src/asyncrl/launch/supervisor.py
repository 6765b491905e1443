"""A role process that comes back: when it dies, or hangs, it is started again from its last
checkpoint, after a backoff, until its restart budget is spent.

A role hangs when its heartbeat file (`asyncrl.heartbeat`, beaten by a thread of the role)
stays silent for `restart.hang_timeout` seconds while the process is alive: it is stopped or
frozen, not slow. It is then killed with its process group (SIGKILL reaches a stopped process
too) and restarted like a role that died. Each restart is logged with the role, how it ended
and the end of its log; past the budget the run stops with `RoleFailed`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.config.restart import RestartConfig
from asyncrl.heartbeat import HEARTBEAT_ENV, silent_for
from asyncrl.launch.roles import RoleFailed
from asyncrl.log import get_logger
from asyncrl.processes import start, tail

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


def how_it_ended(code: int) -> str:
    if code < 0:
        return f"exited with code {code} ({signal.Signals(-code).name})"
    return f"exited with code {code}"


class SupervisedRole:
    """One role's process and its restart bookkeeping; `check()` it a few times a second."""

    def __init__(self, spec: RoleSpec, policy: RestartConfig) -> None:
        self.spec, self.policy = spec, policy
        self.restarts = 0
        self.restart_at: float | None = None
        self.finished = False
        self.process = self._start(spec.command)

    def _start(self, command: list[str]) -> subprocess.Popen[bytes]:
        self.spec.heartbeat.unlink(missing_ok=True)  # a new process beats afresh
        env = {**self.spec.env, HEARTBEAT_ENV: str(self.spec.heartbeat)}
        return start(command, self.spec.log, env)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

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
            timeout = self.policy.hang_timeout
            if timeout is None or silent is None or silent <= timeout:
                return
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self._died(f"hung (no heartbeat for {silent:.0f} s) and was killed", now)
            return
        if code == 0 and self.spec.finishes:
            self.finished = True
            return
        ending = how_it_ended(code) if code else "stopped before training ended"
        self._died(ending, now)

    def _died(self, ending: str, now: float) -> None:
        name, log = self.spec.name, self.spec.log
        what = f"`asyncrl {name}` {ending}"
        if self.spec.cannot_restart is not None and self.policy.max_restarts > 0:
            what += f" and cannot be restarted ({self.spec.cannot_restart})"
        elif ending == how_it_ended(CONFIG_ERROR) and self.policy.max_restarts > 0:
            what += " (a configuration error: a restart would meet it again)"
        elif self.restarts >= self.policy.max_restarts:
            if self.policy.max_restarts > 0:
                what += f" after {self.restarts} restart(s), the budget of restart.max_restarts"
        else:
            delay = self.policy.backoff * 2**self.restarts
            self.restarts += 1
            self.restart_at = now + delay
            logger.warning(
                "rl: %s; restart %d of %d in %.0f s, from its last checkpoint. End of %s:\n%s",
                what, self.restarts, self.policy.max_restarts, delay, log, tail(log, 10),
            )  # fmt: skip
            return
        raise RoleFailed(f"{what}; end of {log}:\n{tail(log)}")
