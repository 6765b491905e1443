"""No wait without a deadline: every wait of one role for another ends by default, and its end
says what it waited for and which key sets the deadline (issue 60). The orchestrator's wait
for weights, the trainer's wait for the run directory, and a colocated trainer's wait for the
orchestrator to finish the run each had none unless a user set one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.launch.inference_process import free_port
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.weight_sync import WeightSync
from asyncrl.run.layout import find_run_dir, run_dir
from asyncrl.transport.weights.colocated import ColocatedRoute


def test_each_wait_between_roles_has_a_finite_deadline_by_default() -> None:
    orchestrator = OrchestratorConfig(model={"name": "m"})
    trainer = TrainerConfig(model="m")
    assert 0 < orchestrator.ckpt.wait_for_weights_timeout < float("inf")
    assert 0 < orchestrator.client.startup_timeout < float("inf")
    assert 0 < trainer.run_dir_timeout < float("inf")
    assert 0 < trainer.finish_timeout < float("inf")


def test_the_wait_for_weights_ends_naming_the_version_and_its_key(tmp_path: Path) -> None:
    config = OrchestratorConfig(
        model={"name": "m"}, output_dir=str(run_dir(tmp_path, "r")),
        client={"base_url": [f"http://127.0.0.1:{free_port()}/v1"]},
        ckpt={"wait_for_weights_timeout": 0.3},
    )  # fmt: skip

    async def scenario() -> None:
        clients = ClientPool(config.client)
        clients.servers[0].state = "down"  # no trainer publishes, no server answers
        sync = WeightSync(config, Path(config.output_dir), clients)
        try:
            await sync.sync(need=1)
        finally:
            sync.close()
            await clients.close()

    with pytest.raises(TimeoutError, match=r"gave up waiting for weights version 1 from the "
                       r"trainer after 0 s \(the deadline is `orchestrator\.ckpt\."
                       r"wait_for_weights_timeout`\)"):  # fmt: skip
        asyncio.run(asyncio.wait_for(scenario(), timeout=30))


def test_the_trainer_s_wait_for_the_run_directory_names_it_and_its_key(tmp_path: Path) -> None:
    config = TrainerConfig(model="m", output_dir=str(tmp_path), run_name="missing")
    with pytest.raises(TimeoutError, match=r"run_missing after 0 s \(the deadline is "
                       r"`trainer\.run_dir_timeout`\)"):  # fmt: skip
        find_run_dir(config, 0.2, "trainer.run_dir_timeout")


def test_a_colocated_trainer_stops_serving_when_the_orchestrator_never_finishes(
    tmp_path: Path,
) -> None:
    """It served for ever after its last step when the orchestrator died without finishing."""
    config = TrainerConfig(
        model="m", output_dir=str(tmp_path), colocated_inference={"model": "m"},
        finish_timeout=0.3, max_steps=1,
    )  # fmt: skip

    def no_engine(*args: Any) -> Any:
        raise AssertionError("not started in this test")

    route = ColocatedRoute(config, run_dir(tmp_path, "default"), no_engine)
    with pytest.raises(TimeoutError, match=r"the orchestrator to finish the run \(to write .*"
                       r"\) after 0 s \(the deadline is `trainer\.finish_timeout`\)"):  # fmt: skip
        route.finish()
