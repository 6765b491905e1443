"""Run `asyncrl infer` as a child process and wait until it answers /health (tests and
benchmarks start their servers with this)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from asyncrl.processes import wait_healthy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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

    `args` are further `asyncrl infer` overrides (`"--max_model_len", "256"`).
    """
    port = port or free_port()
    command = [
        sys.executable, "-m", "asyncrl.cli", "infer",
        "--model", str(model), "--port", str(port), *args,
    ]  # fmt: skip
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, startup_timeout)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log is not subprocess.DEVNULL:
            log.close()
