"""The Ray actor that runs one role: `asyncrl infer|orch|train <config>` as its child process.

The actor is deliberately thin. It runs the role exactly as the local launcher does (same
command, own process group, ended by the kernel if the actor dies), so no role knows it is on
Ray, and it answers the driver's questions: where am I, is my child alive, what did it log. Every
method returns at once, so the driver can stream logs while a role is still starting up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from asyncrl.fs import atomic_write_bytes
from asyncrl.heartbeat import HEARTBEAT_ENV, silent_for
from asyncrl.ports import free_ports
from asyncrl.process_privacy import make_unreadable
from asyncrl.processes import answers_health, kill_group, start, stop
from asyncrl.run_secret import server_key

LOG_CHUNK = 1 << 20  # bytes of log handed to the driver per call


class RoleActor:
    def __init__(self, label: str) -> None:
        self.label = label
        self.process: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.keys: dict[str, str] = {}  # the run's secret and keys: its role gets them on a socket
        self.command: list[str] = []
        self.cwd = "."
        # the child's log and heartbeat stay on this node; the driver copies the log into logs/
        self.scratch = Path(tempfile.mkdtemp(prefix=f"asyncrl-{label}-"))  # removed by cleanup()
        self.log_path, self.heartbeat = self.scratch / "role.log", self.scratch / "heartbeat"

    def place(self) -> dict[str, Any]:
        """This actor's node address, the devices Ray gave it, and its process id."""
        import ray

        return {
            "address": ray.util.get_node_ip_address(),
            "devices": [str(device) for device in ray.get_gpu_ids()],
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }

    def free_ports(self, count: int) -> list[int]:
        """`count` distinct ports free on this node now, outside the range the kernel hands out
        by itself (a role binds each a moment later, and again when it restarts)."""
        return free_ports(count)

    def write_probe(self, directory: str, token: str) -> str | None:
        """Leave `token` in `directory/<label>`; the reason if this node cannot write there."""
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(Path(directory) / self.label, token.encode())
        except OSError as error:
            return f"{self.label} cannot write {directory}: {error}"
        return None

    def remove_probe(self, directory: str) -> None:
        """Remove this actor's probe, and `directory` and its parent once empty (a node whose
        run directory is its own keeps no trace either)."""
        Path(directory, self.label).unlink(missing_ok=True)
        for folder in (Path(directory), Path(directory).parent):
            with contextlib.suppress(OSError):  # not empty: other probes, or other runs'
                folder.rmdir()

    def missing_probes(self, directory: str, expected: dict[str, str]) -> list[str]:
        """Labels whose probe this node does not see in `directory` (not shared storage)."""
        missing = []
        for label, token in expected.items():
            try:
                seen = (Path(directory) / label).read_text()
            except OSError:
                seen = None
            if seen != token:
                missing.append(label)
        return missing

    def start(
        self,
        role: str,
        config_yaml: str,
        config_path: str,
        env: dict[str, str],
        cwd: str,
        keys: dict[str, str] | None = None,
    ) -> int:
        """Write the role's config and start `asyncrl <role>` on it, `keys` handed over on a
        socket (`secret_handover.py`); returns the child's pid."""
        self.keys = dict(keys or {})
        if self.keys:  # no other process of this node's user may read them here
            make_unreadable()
        path = Path(cwd, config_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, config_yaml.encode())
        self.command, self.env, self.cwd = (
            [sys.executable, "-m", "asyncrl.cli", role, str(path)],
            env,
            cwd,
        )
        return self._run(self.command)

    def restart(self, extra: list[str]) -> int:
        """Start the role again, as first started plus `extra` arguments (resume from its last
        checkpoint); the previous child must have ended. Returns the new child's pid."""
        return self._run([*self.command, *extra])

    def _run(self, command: list[str]) -> int:
        self.heartbeat.unlink(missing_ok=True)  # a new child beats afresh
        env = {**self.env, HEARTBEAT_ENV: str(self.heartbeat)}
        self.process = start(command, self.log_path, env, cwd=self.cwd, keys=self.keys)
        return self.process.pid

    def status(self) -> tuple[int | None, float | None]:
        """The child's exit code (None while it runs) and seconds since its last heartbeat
        (None before the first)."""
        return self.poll(), silent_for(self.heartbeat)

    def kill_role(self) -> None:
        """SIGKILL the child's whole group: a hung role (a stopped process too)."""
        if self.process is not None and self.process.poll() is None:
            kill_group(self.process)

    def healthy(self, url: str) -> bool:
        return answers_health(url)

    def poll(self) -> int | None:
        """The child's exit code, None while it runs (or before it started)."""
        return None if self.process is None else self.process.poll()

    def read_log(self, offset: int) -> tuple[bytes, int]:
        """The child's output from byte `offset` on (at most LOG_CHUNK) and the next offset."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                chunk = log.read(LOG_CHUNK)
        except FileNotFoundError:
            return b"", offset
        return chunk, offset + len(chunk)

    def server_state(self, url: str, api_key_var: str) -> dict[str, Any]:
        """An inference role's weights version and fingerprint, and the tokens it generated."""
        import json

        key = server_key(api_key_var, self.keys)  # the key its role serves with
        request = urllib.request.Request(
            f"{url}/weight_info", headers={"Authorization": f"Bearer {key}"} if key else {}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            state: dict[str, Any] = json.loads(response.read())
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(("asyncrl:generation_tokens_total", "vllm:generation_tokens")):
                    state["generation_tokens_total"] = float(line.rsplit(" ", 1)[1])
        return state

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM the child's group, SIGKILL after `grace` s; its exit code."""
        if self.process is None:
            return None
        stop(self.process, grace)
        return self.process.returncode

    def cleanup(self) -> None:
        """Stop the child if it still runs, and remove this actor's scratch directory (its log
        copy, its heartbeat): the driver calls it before killing the actor."""
        if self.process is not None:
            stop(self.process, grace=5.0)
        shutil.rmtree(self.scratch, ignore_errors=True)
