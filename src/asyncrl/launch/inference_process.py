"""Run `asyncrl infer` as a child process and wait until it answers /health (tests and
benchmarks start their servers with this).

A port picked here is free when picked and bound by the child a moment later; in between, a
process beside us (another test worker) may take it. So ports come from below the kernel's
ephemeral range (`ports.free_ports`), where no outgoing connection is ever handed one, and a
server that lost its port anyway (uvicorn exits at start-up, "address already in use" in its
log) is started again on a fresh one. Its output always goes to a log, whose tail a failure
shows: a server that dies at start-up says why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from asyncrl.ports import free_ports
from asyncrl.processes import tail, wait_healthy

PORT_TAKEN = "address already in use"  # in uvicorn's log when its bind fails (errno EADDRINUSE)
STARTS = 3  # tries on fresh ports before a lost port is reported


def free_port() -> int:
    """A port free on 127.0.0.1 now, from below the ephemeral range."""
    return free_ports(1, "127.0.0.1")[0]


@contextmanager
def inference_server(
    model: str | Path,
    *args: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    startup_timeout: float = 120.0,
) -> Iterator[str]:
    """Yield the base URL (`http://127.0.0.1:PORT`) of a live server; stop it on exit.

    `args` are further `asyncrl infer` overrides (`"--max_model_len", "256"`). Its output goes
    to `log_path`, or to a temporary file removed afterwards.
    """
    with tempfile.TemporaryDirectory(prefix="asyncrl-infer-") as scratch:
        log = log_path or Path(scratch) / "server.log"
        for attempt in range(1, STARTS + 1):
            chosen = port or free_port()
            # the first start truncates the log, as a fresh run's; a retry appends to it
            offset = log.stat().st_size if attempt > 1 else 0
            process = _start(model, args, chosen, env, log, append=attempt > 1)
            url = f"http://127.0.0.1:{chosen}"
            try:
                try:
                    wait_healthy(url, process, startup_timeout)
                except RuntimeError as error:  # it exited before answering
                    if port is None and attempt < STARTS and _port_taken(log, offset):
                        continue  # another process took the port first: a fresh one
                    raise RuntimeError(f"{error}; the end of {log}:\n{tail(log)}") from None
                except TimeoutError as error:
                    raise TimeoutError(f"{error}; the end of {log}:\n{tail(log)}") from None
                yield url
                return
            finally:
                _stop(process)


def _port_taken(log: Path, offset: int) -> bool:
    """Whether this start's own output (the log from `offset` on) says its port was taken."""
    with open(log, "rb") as output:
        output.seek(offset)
        return PORT_TAKEN in output.read().decode(errors="replace").lower()


def _start(
    model: str | Path,
    args: tuple[str, ...],
    port: int,
    env: dict[str, str] | None,
    log: Path,
    append: bool,
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "asyncrl.cli", "infer",
        "--model", str(model), "--port", str(port), *args,
    ]  # fmt: skip
    with open(log, "ab" if append else "wb") as output:  # the child holds its own copy
        return subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
