"""Child processes that never outlive the launcher.

Each child gets its own process group (so a signal reaches its own children too) and, on Linux,
asks the kernel to send it SIGTERM if the launcher dies, even by SIGKILL (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from asyncrl.lifetime import die_with_parent


def start(
    command: Sequence[str],
    log_path: Path | None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start `command` in its own process group, dying with us; its output goes to `log_path`,
    or to our own stdout and stderr when that is None."""
    log = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 - the child holds it, we close our copy
    try:
        return subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT if log else None,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent,  # only sets a signal: safe before exec
        )
    finally:
        if log is not None:
            log.close()


def stop(process: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the child's whole group, then SIGKILL after `grace` seconds."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
