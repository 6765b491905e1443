"""Child processes that never outlive their parent, and waiting for a child server to answer.

Used by whatever starts a process: the launchers (a role per child) and the inference role
(vLLM or SGLang as its child), so neither depends on the other. Each child gets its own process
group (so a signal reaches its own children too) and, on Linux, asks the kernel to send it
SIGTERM if its parent dies, even by SIGKILL (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from asyncrl.lifetime import die_with_parent
from asyncrl.log import get_logger
from asyncrl.secret_handover import Handover

logger = get_logger(__name__)


class ChildProcess(Protocol):
    """What starting a child gives back and stopping one needs: a `subprocess.Popen`, or a role
    forked by the launcher (`launch/role_fork.py`)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def start(
    command: Sequence[str],
    log_path: Path | None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    inherit: bool = True,
    keys: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `command` in its own process group, dying with us; its output goes to `log_path`,
    or to our own stdout and stderr when that is None. Its environment is ours plus `env`, or
    `env` alone when not `inherit`; `keys` reach it over a private socket, never in its
    environment (`secret_handover.py`: an asyncrl process reads them as it starts)."""
    log = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 - the child holds it, we close our copy
    handover = Handover(keys) if keys else None
    environment = {**os.environ, **(env or {})} if inherit else dict(env or {})
    try:
        return subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT if log else None,
            stdin=subprocess.DEVNULL,
            env={**environment, **(handover.environment if handover else {})},
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent,  # only sets a signal: safe before exec
            pass_fds=(handover.descriptor,) if handover else (),
        )
    finally:
        if log is not None:
            log.close()
        if handover is not None:
            handover.close()


def stop(process: ChildProcess, grace: float = 15.0) -> None:
    """SIGTERM the child's whole group, then SIGKILL after `grace` seconds."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_group(process)
    except ProcessLookupError:
        process.wait()


def kill_group(process: ChildProcess) -> None:
    """SIGKILL the child's whole group and reap it. A group already gone (it ended between
    the caller's `poll()` and now, and was reaped) is no error: it is what was wanted."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def answers_health(url: str) -> bool:
    """One probe of `url/health`: True on 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_healthy(url: str, process: ChildProcess, timeout: float) -> None:
    """Poll `url/health` until 200; raise if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"inference server exited with code {process.returncode}")
        if answers_health(url):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"inference server at {url} not healthy after {timeout:.0f} s")
        time.sleep(0.2)


async def kill_session(process: asyncio.subprocess.Process, what: str, grace: float = 2.0) -> None:
    """SIGKILL a worker started in a session of its own (its pid is the session's group) and
    reap it; never wait on pipes a stray child still holds: after `grace` seconds, abandon it."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    if process.stdin is not None:
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), grace)
    except TimeoutError:
        logger.warning("%s (process %d) left a pipe open; abandoning it", what, process.pid)
