"""Run `asyncrl infer` as a child process and wait until it answers /health."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers_health(url: str) -> bool:
    """One probe of `url/health`: True on 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
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
