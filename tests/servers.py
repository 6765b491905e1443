"""Start a real `asyncrl infer` process for tests and stop it afterwards."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(
    model_dir: Path,
    *extra_args: str,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    startup_timeout: float = 120.0,
) -> Iterator[str]:
    """Yield the base URL (`http://127.0.0.1:PORT`) of a live server; kill it on exit."""
    port = free_port()
    command = [
        sys.executable, "-m", "asyncrl.cli", "infer",
        "--model", str(model_dir), "--port", str(port), "--dtype", "float32", *extra_args,
    ]  # fmt: skip
    log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}: {command}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy after {startup_timeout} s")
            time.sleep(0.2)
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
