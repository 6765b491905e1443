"""A role forked from the launcher starts as a fresh `python -m asyncrl.cli <role>` would: its
own session, streams, environment, command line, thread count, signals, random numbers and exit
code, none of the launcher's open files. The child runs `asyncrl.cli.main`, patched here (the
fork carries the patch over) to report what it sees; the integration tests run real roles this
way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import asyncrl.cli
import asyncrl.launch.role_fork
from asyncrl.launch.role_fork import fork_role, forking_roles, role_command


def command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "asyncrl.cli", *arguments]


def test_only_this_interpreters_asyncrl_commands_are_forked() -> None:
    assert role_command(command("train", "c.yaml")) == ["train", "c.yaml"]
    assert role_command(["/other/python", "-m", "asyncrl.cli", "train", "c.yaml"]) is None
    assert role_command([sys.executable, "-c", "pass"]) is None
    with pytest.raises(ValueError, match="not an asyncrl command"):
        fork_role([sys.executable, "-c", "pass"], Path("unused.log"), {})


def test_roles_are_exec_d_where_asked_or_where_a_gpu_driver_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(asyncrl.launch.role_fork, "could_have_gpus", lambda: False)
    assert forking_roles("fork") and not forking_roles("exec")
    monkeypatch.setattr(asyncrl.launch.role_fork, "could_have_gpus", lambda: True)
    assert not forking_roles("fork")  # the launcher asks CUDA: no fork may use it after


def test_a_forked_role_sees_what_a_fresh_process_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "report.json"
    import torch

    threads = 1 if torch.get_num_threads() != 1 else 2  # not what the launcher has

    def probe(arguments: list[str]) -> int:
        draws = torch.rand(4).tolist()  # first: the engine samples from torch's own generator
        a = torch.randn(600, 600)
        for _ in range(3):
            a = torch.tanh(a @ a)  # the child's own OpenMP pool: it must not hang
        seen = {
            "arguments": arguments,
            "argv": sys.argv[1:],
            "variable": os.environ.get("ASYNCRL_FORK_PROBE"),
            "own_session": os.getsid(0) == os.getpid(),
            "cmdline": Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode(),
            "threads": torch.get_num_threads(),
            "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
            "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "draws": draws,
        }
        report.write_text(json.dumps(seen))
        print("said on stdout")
        print("said on stderr", file=sys.stderr)
        return 7

    monkeypatch.setattr(asyncrl.cli, "main", probe)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # the launcher's own handler
    launcher_file = open(tmp_path / "held-by-the-launcher", "w")  # noqa: SIM115
    try:
        env = {"ASYNCRL_FORK_PROBE": "set", "OMP_NUM_THREADS": str(threads)}
        role = fork_role(command("probe", "x.yaml"), tmp_path / "logs" / "probe.log", env)
        assert role.wait(timeout=120) == 7
    finally:
        launcher_file.close()
        signal.signal(signal.SIGTERM, previous)
    seen = json.loads(report.read_text())
    assert seen["arguments"] == ["probe", "x.yaml"] and seen["argv"] == ["probe", "x.yaml"]
    assert seen["variable"] == "set" and seen["own_session"] and seen["sigterm_default"]
    assert "asyncrl.cli probe x.yaml" in seen["cmdline"]  # what `ps` shows
    assert seen["threads"] == threads
    # 0-2, and the one listing /proc/self/fd: nothing of the launcher's
    assert len(seen["fds"]) <= 4 and seen["fds"][:3] == [0, 1, 2]
    log = (tmp_path / "logs" / "probe.log").read_text()
    assert "said on stdout" in log and "said on stderr" in log
    # the launcher has drawn nothing since the fork: a child that kept its generator's state
    # would have drawn these very numbers
    assert seen["draws"] != torch.rand(4).tolist()


def test_a_forked_role_that_raises_leaves_its_traceback_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(arguments: list[str]) -> int:
        raise RuntimeError("the role broke")

    monkeypatch.setattr(asyncrl.cli, "main", fails)
    role = fork_role(command("orch", "c.yaml"), tmp_path / "orch.log", {})
    assert role.wait(timeout=60) == 1
    log = (tmp_path / "orch.log").read_text()
    assert "Traceback" in log and "RuntimeError: the role broke" in log


def test_a_forked_role_is_in_its_own_group_at_once_and_sigterm_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncrl.cli, "main", lambda arguments: time.sleep(60) or 0)
    role = fork_role(command("infer", "c.yaml"), tmp_path / "infer.log", {})
    # it leads its own group the moment it is returned: a stop sent at once reaches it (a judge
    # restarted as its run ended outlived `stop` when this was not so)
    assert os.getpgid(role.pid) == role.pid
    with pytest.raises(subprocess.TimeoutExpired):
        role.wait(timeout=0.2)
    assert role.poll() is None
    os.killpg(role.pid, signal.SIGTERM)  # its own group, as `processes.stop` sends it
    assert role.wait(timeout=30) == -signal.SIGTERM
