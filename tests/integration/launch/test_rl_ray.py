"""`asyncrl rl --launcher ray` on real Ray, on this CPU: a cluster started with `ray start --head`
(joined with `ray.address: auto`) and a local instance the run starts itself. Two inference
servers behind one orchestrator, a 2-rank trainer, a killed actor, an unplaceable request."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from asyncrl.launch.inference_process import free_port
from asyncrl.monitor.metrics import read_metrics
from asyncrl.monitor.run_audit import audit_run
from asyncrl.transport.batches import read_batch

from .run_processes import signal_running
from .test_rl_launcher import survivors

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RAY = str(Path(sys.executable).parent / "ray")
STEPS = 6
ASYNC_LEVEL = 1


@dataclass(frozen=True)
class RayCluster:
    address: str  # what a user joins with
    env: dict[str, str]  # for every driver of this module: the cluster's token, a private HOME


def private_ray_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment with HOME private (Ray reads and writes `~/.ray/auth_token`) and no
    Ray authentication setting of the caller's."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    return env | {"HOME": str(home)} | extra


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """A one-node Ray cluster with 6 logical CPUs, as `ray start --head` makes it, with token
    authentication and its own token, which every driver of this module is given: nothing
    another test leaves in `~/.ray` can change how a driver joins it."""
    env = private_ray_env(
        tmp_path_factory.mktemp("ray-home"),
        RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
    )  # fmt: skip
    port = free_port()
    subprocess.run(
        [RAY, "start", "--head", f"--port={port}", "--num-cpus=6", "--include-dashboard=false",
         "--disable-usage-stats", f"--object-store-memory={1 << 28}"],
        check=True, capture_output=True, timeout=120, env=env,
    )  # fmt: skip
    try:
        yield RayCluster("auto", env)
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120, env=env)


def ray_config(model: Path, output: Path, **ray: object) -> Path:
    config = {
        "model": str(model), "output_dir": str(output), "seq_len": 256, "max_steps": STEPS,
        "max_async_level": ASYNC_LEVEL, "launcher": "ray",
        "ray": {"inference": {"replicas": 2}, "placement_timeout": 60, **ray},
        "inference": {"max_num_seqs": 32},
        "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 8,
                         "rollouts_per_example": 4, "max_off_policy_steps": 2,
                         "sampling": {"max_tokens": 12}},
        "trainer": {"lora": False, "optimizer": "adamw", "recipe": "fp32",
                    "learning_rate": 1e-4, "world_size": 2},
    }  # fmt: skip
    path = output.parent / f"{output.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def cluster_state(cluster: RayCluster) -> dict[str, object]:
    """Named actors alive and placement-group states, asked of the cluster by a fresh driver."""
    script = (
        "import json, ray\n"
        f"ray.init(address={cluster.address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "from ray.util.placement_group import placement_group_table\n"
        "actors = [a['name'] for a in ray.util.list_named_actors(all_namespaces=True)]\n"
        "groups = {g['name']: g['state'] for g in placement_group_table().values()}\n"
        "print(json.dumps({'actors': actors, 'groups': groups}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True,
        env=cluster.env,
    )  # fmt: skip
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def start_until_first_step(
    command: list[str], output: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start `asyncrl rl` and return once the trainer has logged a step. The launcher gets
    SIGINT at its default (KeyboardInterrupt): a test run started in the background by a shell
    without job control inherits SIGINT ignored, and Ctrl-C would then never reach it."""
    launcher = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    metrics = output / "run_default" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and read_metrics(metrics, role="trainer")):
        if launcher.poll() is not None:
            stderr = launcher.stderr.read().decode() if launcher.stderr else ""
            code = launcher.returncode
            raise AssertionError(f"the launcher exited with {code}:\n{stderr[-3000:]}")
        assert time.monotonic() < deadline, "no step was trained in 300 s"
        time.sleep(0.5)
    return launcher


def test_two_servers_and_two_ranks_on_a_ray_cluster(
    ray_cluster: RayCluster, tiny_model_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    config = ray_config(tiny_model_dir, output)
    command = [sys.executable, "-m", "asyncrl.cli", "rl", str(config),
               "--ray.address", ray_cluster.address]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=ray_cluster.env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = output / "run_default"

    trainer = read_metrics(run_dir / "metrics.jsonl", role="trainer")
    assert [r["step"] for r in trainer] == list(range(1, STEPS + 1))  # each step exactly once
    orchestrator = read_metrics(run_dir / "metrics.jsonl", role="orchestrator")
    assert [r["step"] for r in orchestrator] == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):  # the staleness bound held for every rollout
        for sample in read_batch(run_dir, step).samples:
            assert max(sample.policy_versions) >= step - 1 - ASYNC_LEVEL

    roles = {r["label"]: r for r in json.loads((output / "logs" / "roles.json").read_text())}
    assert sorted(roles) == ["infer-0", "infer-1", "orch", "train-0", "train-1"]
    final_marker = json.loads((run_dir / "broadcasts" / f"step_{STEPS}" / "STABLE").read_text())
    for server in ("infer-0", "infer-1"):
        final = roles[server]["final"]
        assert final["generation_tokens_total"] > 0  # both served rollouts
        assert final["version"] == STEPS  # and hold the trained weights
        assert final["fingerprint"] == final_marker["fingerprint"]
        # on a cluster the servers listen on the node's address, behind an API key
        assert not roles[server]["url"].startswith("http://127.0.0.1")
    assert "rank 1 of 2" in (output / "logs" / "train-1.log").read_text()
    assert (output / "logs" / "infer-1.log").stat().st_size > 0

    state = cluster_state(ray_cluster)
    names = {record["ray_name"] for record in roles.values()}
    assert not names & set(state["actors"])  # type: ignore[arg-type]
    groups = state["groups"]
    assert isinstance(groups, dict)
    group = "-".join(roles["orch"]["ray_name"].split("-")[:2])  # asyncrl-<run id>
    ours = [s for name, s in groups.items() if name == group]
    assert ours == ["REMOVED"]
    assert not survivors(str(output))


def test_batches_and_weights_over_the_network_reach_both_servers(
    ray_cluster: RayCluster, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """zmq batches and NCCL (gloo) weights: the servers join rank 0's weight group as ranks 1
    and 2, at the addresses the actors reported; no batch or weight file is written."""
    output = tmp_path / "networked"
    config = ray_config(tiny_model_dir, output)
    steps = 3
    command = [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--ray.address",
               ray_cluster.address, "--max_steps", str(steps), "--trainer.world_size", "1",
               "--orchestrator.rollout_transport.type", "zmq",
               "--trainer.weight_broadcast.type", "nccl"]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=ray_cluster.env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = output / "run_default"
    assert not (run_dir / "rollouts").exists()
    assert [p.name for p in (run_dir / "broadcasts" / f"step_{steps}").iterdir()] == ["STABLE"]
    trainer = read_metrics(run_dir / "metrics.jsonl", role="trainer")
    assert [r["step"] for r in trainer] == list(range(1, steps + 1))
    marker = json.loads((run_dir / "broadcasts" / f"step_{steps}" / "STABLE").read_text())
    roles = {r["label"]: r for r in json.loads((output / "logs" / "roles.json").read_text())}
    for server in ("infer-0", "infer-1"):
        assert roles[server]["final"]["version"] == steps
        assert roles[server]["final"]["fingerprint"] == marker["fingerprint"]
    assert not survivors(str(output))


def test_a_killed_inference_actor_stops_the_run_naming_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """On a local Ray instance the run starts itself (`ray.address` unset), authenticated with
    a token of the run's own: nothing is written to `~/.ray`, where Ray would otherwise leave a
    token that makes every later `address: auto` driver require one (CI's failures)."""
    output = tmp_path / "killed"
    home = tmp_path / "home"
    config = ray_config(tiny_model_dir, output, num_cpus=4)
    command = [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--max_steps", "1000",
               "--trainer.world_size", "1"]  # fmt: skip
    launcher = start_until_first_step(command, output, private_ray_env(home))
    roles = {r["label"]: r for r in json.loads((output / "logs" / "roles.json").read_text())}
    os.kill(roles["infer-1"]["pid"], signal.SIGKILL)  # the actor's worker process
    try:
        _, stderr = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    message = stderr.decode()
    assert "`infer-1`" in message and "died" in message, message[-3000:]
    assert roles["infer-1"]["ray_name"] in message
    time.sleep(1)
    assert not survivors(str(output))  # the other server, trainer and orchestrator were stopped
    assert not (home / ".ray" / "auth_token").exists()


def test_an_unplaceable_request_names_the_bundle(
    ray_cluster: RayCluster, tiny_model_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "unplaceable"
    config = ray_config(tiny_model_dir, output, placement_timeout=5, trainer={"gpus": 1})
    command = [sys.executable, "-m", "asyncrl.cli", "rl", str(config),
               "--ray.address", ray_cluster.address]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=ray_cluster.env
    )
    assert result.returncode == 1
    assert time.monotonic() - started < 60
    assert "could not place the run's 5 bundles (PACK) in 5 s" in result.stderr
    assert "bundle 3 (train-0: CPU 1, GPU 1) fits no node" in result.stderr
    assert "bundle 4 (train-1: CPU 1, GPU 1) fits no node" in result.stderr
    assert "CPU 6" in result.stderr  # what the cluster has
    groups = cluster_state(ray_cluster)["groups"]
    assert isinstance(groups, dict)
    assert "PENDING" not in groups.values()  # the request was withdrawn


def test_ctrl_c_leaves_no_actor_placement_group_or_process(
    ray_cluster: RayCluster, tiny_model_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "interrupted"
    config = ray_config(tiny_model_dir, output)
    command = [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--max_steps", "1000",
               "--ray.address", ray_cluster.address, "--trainer.world_size", "1"]  # fmt: skip
    launcher = start_until_first_step(command, output, ray_cluster.env)
    launcher.send_signal(signal.SIGINT)
    try:
        launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 130
    roles = json.loads((output / "logs" / "roles.json").read_text())
    state = cluster_state(ray_cluster)
    assert not {r["ray_name"] for r in roles} & set(state["actors"])  # type: ignore[arg-type]
    group = "-".join(roles[0]["ray_name"].split("-")[:2])
    assert state["groups"] == {**state["groups"], group: "REMOVED"}  # type: ignore[dict-item]
    assert not survivors(str(output))


def test_a_killed_trainer_rank_restarts_every_rank_from_the_checkpoint(
    ray_cluster: RayCluster, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Rank 1's process (not its actor) dies: both ranks restart together from the last
    checkpoint (written by two ranks, resharded on load) and every step lands exactly once."""
    output = tmp_path / "restarted"
    config = ray_config(tiny_model_dir, output)
    steps = 10  # rank 1 dies past the trainer's step 3: 7 steps before the run ends
    command = [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--ray.address",
               ray_cluster.address, "--orchestrator.ckpt.interval", "2",
               "--restart.backoff", "0.5", "--max_steps", str(steps)]  # fmt: skip
    launcher = start_until_first_step(command, output, ray_cluster.env)
    roles = {r["label"]: r for r in json.loads((output / "logs" / "roles.json").read_text())}
    metrics = output / "run_default" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while max((r["step"] for r in read_metrics(metrics, role="trainer")), default=0) < 3:
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.2)
    signal_running(roles["train-1"]["role_pid"], signal.SIGKILL, "trainer rank 1")
    _, stderr = launcher.communicate(timeout=600)
    message = stderr.decode()
    assert launcher.returncode == 0, message[-3000:]
    assert "the trainer's ranks exited with code -9 (SIGKILL); restart 1 of 3" in message
    audit = audit_run(output / "run_default", steps, ASYNC_LEVEL, 2)
    assert not audit.problems, audit.problems
    assert "resumed from the checkpoint of step" in (output / "logs" / "train-0.log").read_text()
    assert not survivors(str(output))
