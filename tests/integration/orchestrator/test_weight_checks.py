"""The orchestrator takes rollouts only from servers that hold the weights they claim, with a
real server on 127.0.0.1 and versions written as the trainer writes them."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.unit.inference.weight_versions import flip_bit, publish, route, trained

from asyncrl.config.orchestrator import ClientConfig, OrchestratorConfig
from asyncrl.launch.inference_process import inference_server
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.weight_checks import WeightsNotServed
from asyncrl.orchestrator.weight_sync import WeightSync
from asyncrl.transport.broadcast import latest_broadcast, publish_marker
from asyncrl.transport.fingerprint import weights_fingerprint

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path, roots: Path) -> Iterator[str]:
    with inference_server(
        tiny_model_dir, "--max_model_len", "128", "--weight_roots", f"[{roots}]"
    ) as server:
        yield server


def pool_for(url: str) -> ClientPool:
    return ClientPool(ClientConfig(base_url=[f"{url}/v1"]))


def test_two_trainer_versions_of_one_step_racing_to_a_server_leave_the_pool_knowing_which(
    url: str, tiny_model_dir: Path, roots: Path
) -> None:
    """A trainer that restarted writes step 1 again, with other weights, after the pool read
    its marker and before the server read its files: the pool used to record the first
    writer's fingerprint for weights the second one wrote."""
    run_dir = roots / "race"
    publish(route(tiny_model_dir, run_dir), 1, trained(tiny_model_dir, seed=1))
    first = latest_broadcast(run_dir)
    assert first is not None
    shutil.rmtree(first.path)
    publish(route(tiny_model_dir, run_dir), 1, trained(tiny_model_dir, seed=2))  # restarted
    second = latest_broadcast(run_dir)
    assert second is not None and second.fingerprint != first.fingerprint

    async def scenario() -> ClientPool:
        pool = pool_for(url)
        await pool.start(None)
        await pool.load(first, "policy")
        await pool.close()
        return pool

    pool = asyncio.run(scenario())
    served = httpx.get(f"{url}/weight_info").json()
    assert served["verified"] == served["fingerprint"] == second.fingerprint
    assert pool.servers[0].fingerprint == second.fingerprint
    assert (pool.servers[0].version, served["version"]) == (1, 1)


def test_a_version_no_server_can_check_stops_the_run_naming_the_tensor(
    url: str, tiny_model_dir: Path, roots: Path
) -> None:
    run_dir = roots / "corrupt"
    directory = publish(route(tiny_model_dir, run_dir), 1, trained(tiny_model_dir, seed=3))
    name = "model.layers.1.self_attn.q_proj.weight"
    flip_bit(directory / "model.safetensors", name)
    broadcast = latest_broadcast(run_dir)
    assert broadcast is not None
    before = httpx.get(f"{url}/weight_info").json()

    async def scenario() -> None:
        pool = pool_for(url)
        await pool.start(None)
        try:
            await pool.load(broadcast, "policy")
        finally:
            await pool.close()

    with pytest.raises(WeightsNotServed, match=name):
        asyncio.run(scenario())
    after = httpx.get(f"{url}/weight_info").json()
    assert after["fingerprint"] == before["fingerprint"]  # still the weights it checked
    assert after["weight_reloads"] == before["weight_reloads"] + 1


def test_a_server_whose_pushed_weights_are_not_its_versions_takes_no_work(
    url: str, tiny_model_dir: Path, roots: Path
) -> None:
    """Weights that arrive without the orchestrator (NCCL, a colocated trainer) are compared
    with their version's marker: a server holding other weights under that number takes no
    work, and the metric counts it, until it holds the trainer's."""
    run_dir = roots / "pushed"
    right, wrong = trained(tiny_model_dir, seed=4), trained(tiny_model_dir, seed=5)
    right.save_pretrained(roots / "right")
    wrong.save_pretrained(roots / "wrong")
    publish_marker(run_dir, 1, weights_fingerprint(right.named_parameters()), keep=4)
    config = OrchestratorConfig(
        model={"name": str(tiny_model_dir)}, client={"base_url": [f"{url}/v1"]},
        ckpt={"wait_for_weights_timeout": 3},
    )  # fmt: skip

    def push(directory: Path) -> None:  # as a trainer's push leaves it: version 1, other weights
        body = {"weight_dir": str(directory), "version": 1}
        assert httpx.post(f"{url}/update_weights", json=body, timeout=60).status_code == 200

    async def scenario() -> tuple[str, float, str]:
        pool = ClientPool(config.client)
        await pool.start(None)
        sync = WeightSync(config, run_dir, pool)
        push(roots / "wrong")
        with pytest.raises(TimeoutError, match="weights version 1"):
            await sync.sync(need=1)
        held_back = pool.servers[0].state
        reloads = pool.weights.take()["orchestrator/weight_mismatch_reloads"]
        push(roots / "right")
        await sync.sync(need=1)
        sync.close()
        await pool.close()
        return held_back, reloads, pool.servers[0].state

    held_back, reloads, state = asyncio.run(scenario())
    assert held_back == "back" and reloads >= 1 and state == "up"
