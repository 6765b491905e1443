"""Issue 86 (1, 2, 3): a run's own reward code cannot reach into the run.

`asyncrl rl` runs a JSONL reward (a module of the user's) that, the first time it is called,
does what a careless or model-written reward could: asks the run's inference server for its
state and for weight and adapter loads without a key (the issue: `GET /is_paused` answered
200), reads the environment and memory of every process of the run (its ancestors, the
launcher and each role) through `/proc`, and looks for keys and credentials in its own
environment. It writes what it found to a file; the run must still train (the orchestrator's
own, keyed, requests work). Both ways a launcher starts its roles: forked (the default here),
where the user set no key (the issue's case: the server used to take none), and exec'd (a
machine with a GPU driver), where the user exported the run's secret and an inference key, so
that they are in the launcher's own `/proc/<pid>/environ`. A credential of the user's
(`HF_TOKEN`) is exported in both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.launch.inference_process import free_port
from asyncrl.monitor.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "the-runs-secret-exported-by-the-user-0123456789"
CREDENTIAL = {"HF_TOKEN": "hf_the-users-own-token"}
KEYS = {"ASYNCRL_RUN_SECRET": SECRET, "VLLM_API_KEY": "an-inference-key-the-user-exported"}
GUARDED_ROUTES = [
    ("GET", "/is_paused"),
    ("GET", "/v1/models"),
    ("POST", "/resume"),
    ("POST", "/update_weights"),  # an empty body: refused before it is read, not for its content
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/completions"),
]

REWARD = """
import json, os, urllib.error, urllib.request

REPORT, URL, MARKER, ROUTES = {report!r}, {url!r}, {marker!r}, {routes!r}


def attempt(path, mode="rb"):
    try:
        with open(path, mode) as handle:
            return {{"read": True, "text": handle.read(1 << 16).decode(errors="replace")}}
    except OSError as error:
        return {{"read": False, "error": type(error).__name__}}


def ancestors():
    pid, chain = os.getppid(), []
    while pid > 1:
        chain.append(pid)
        status = open(f"/proc/{{pid}}/status").read()
        pid = int(status.split("PPid:")[1].split()[0])
    return chain


def run_processes():
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                command = open(f"/proc/{{name}}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if MARKER in command:
                found.append(int(name))
    return found


def status_of(method, route):
    request = urllib.request.Request(
        URL + route, method=method, data=b"{{}}" if method == "POST" else None,
        headers={{"Content-Type": "application/json"}},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def pry(completion, example):
    if os.path.exists(REPORT):
        return 0.0
    processes = sorted(set(ancestors()) | set(run_processes()))
    report = {{
        "server": {{route: status_of(method, route) for method, route in ROUTES}},
        "ancestors": ancestors(),
        "processes": {{
            pid: {{"cmdline": open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace"),
                   "environ": attempt(f"/proc/{{pid}}/environ"),
                   "mem": attempt(f"/proc/{{pid}}/mem")}}
            for pid in processes
        }},
        "own_environ": dict(os.environ),
        "own_status": open("/proc/self/status").read(),
    }}
    with open(REPORT + ".tmp", "w") as out:
        json.dump(report, out)
    os.replace(REPORT + ".tmp", REPORT)
    return 0.0
"""


def run_with_a_prying_reward(
    model: Path, tmp_path: Path, role_start: str, exported: dict[str, str]
) -> dict:
    output, port = tmp_path / "run", free_port()
    report = tmp_path / "report.json"
    (tmp_path / "prying.py").write_text(REWARD.format(
        report=str(report), url=f"http://127.0.0.1:{port}", marker=str(tmp_path),
        routes=GUARDED_ROUTES,
    ))  # fmt: skip
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input": f"say {n}", "answer": str(n)}) + "\n"
                            for n in range(8)))  # fmt: skip
    config = {
        "model": str(model), "output_dir": str(output), "seq_len": 128, "max_steps": 2,
        "max_async_level": 1, "role_start": role_start,
        "inference": {"port": port, "max_num_seqs": 16},
        "orchestrator": {"env": [{"id": "jsonl", "args": {"path": str(data),
                                                          "reward": "prying:pry"}}],
                         "batch_size": 4, "rollouts_per_example": 2, "reward_workers": 1,
                         "sampling": {"max_tokens": 4}},
        "trainer": {"lora": False, "optimizer": "adamw", "recipe": "fp32"},
    }  # fmt: skip
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(config))
    python_path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    environment = {k: v for k, v in os.environ.items() if k not in KEYS}
    environment |= {**exported, "PYTHONPATH": python_path}
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(path)], capture_output=True,
        text=True, timeout=600, env=environment,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(output / "run_default" / "metrics.jsonl")
    assert [r["step"] for r in records if r["role"] == "trainer"] == [1, 2]  # keyed: it works
    return json.loads(report.read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
@pytest.mark.parametrize(
    ("role_start", "exported"), [("fork", CREDENTIAL), ("exec", {**CREDENTIAL, **KEYS})]
)
def test_a_reward_can_neither_use_the_runs_server_nor_read_its_processes(
    tiny_model_dir: Path, tmp_path: Path, role_start: str, exported: dict[str, str]
) -> None:
    seen = run_with_a_prying_reward(tiny_model_dir, tmp_path, role_start, exported)
    assert seen["server"] == {route: 401 for _, route in GUARDED_ROUTES}

    processes = {int(pid): what for pid, what in seen["processes"].items()}
    commands = {pid: what["cmdline"].replace("\0", " ") for pid, what in processes.items()}
    roles = {pid for pid, command in commands.items() if " -m asyncrl.cli " in command}
    launcher = [pid for pid in roles if " -m asyncrl.cli rl " in commands[pid]]
    assert len(launcher) == 1 and len(roles) >= 4  # the launcher, inference, trainer, orch
    # every ancestor up to the launcher (the orchestrator, the launcher), and every role
    up_to_launcher = seen["ancestors"][: seen["ancestors"].index(launcher[0]) + 1]
    assert set(up_to_launcher) <= roles and len(up_to_launcher) >= 2
    for pid in roles:
        what = processes[pid]
        assert not what["environ"]["read"], (pid, what["cmdline"])
        assert not what["mem"]["read"], (pid, what["cmdline"])

    own = seen["own_environ"]
    assert not set(exported.values()) & set(own.values())
    assert not {"ASYNCRL_RUN_SECRET", "VLLM_API_KEY", "HF_TOKEN", "ASYNCRL_SECRETS_FD"} & set(own)
    if os.geteuid() == 0:  # root reads any process unless it lacks CAP_SYS_PTRACE
        bounding = int(seen["own_status"].split("CapBnd:")[1].split()[0], 16)
        assert not bounding & (1 << 19)
