"""A server that aborts every request stops the run with its name, instead of the orchestrator
launching groups for ever (each aborted group is dropped and a new one launched).

A real embedded server and the real orchestrator loop; a control thread plays a weight updater
gone wrong: pause with mode=abort, resume, again, every few tens of milliseconds, so every
attempt at every group is cut short."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.launch.inference_process import inference_server
from asyncrl.orchestrator.orchestrator import Orchestrator
from asyncrl.transport.batches import batch_path

pytestmark = pytest.mark.integration


def abort_until(stop: threading.Event, url: str) -> None:
    with httpx.Client(base_url=url, timeout=10) as control:
        while not stop.is_set():
            control.post("/pause", params={"mode": "abort"}).raise_for_status()
            control.post("/resume").raise_for_status()
            time.sleep(0.03)


def test_a_server_aborting_every_request_stops_the_run_naming_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"input": f"abc{i}", "answer": "x"}) for i in range(8)))
    with inference_server(tiny_model_dir, "--max_model_len", "512") as url:
        config = OrchestratorConfig(
            model={"name": str(tiny_model_dir)},
            env=[{"id": "jsonl", "args": {"path": str(data), "reward": "lcs"}}],
            batch_size=2, rollouts_per_example=2, max_steps=1, output_dir=str(tmp_path / "run"),
            client={"base_url": [f"{url}/v1"]},
            sampling={"max_tokens": 400, "min_tokens": 400, "temperature": 1.0},
        )  # fmt: skip
        orchestrator = Orchestrator(config)
        limit = orchestrator.gave_up_on_aborts
        assert limit == 16  # one group in flight: the floor
        stop = threading.Event()
        aborter = threading.Thread(target=abort_until, args=(stop, url), daemon=True)
        aborter.start()
        try:
            with pytest.raises(RuntimeError) as raised:
                asyncio.run(asyncio.wait_for(orchestrator.run(), timeout=240))
        finally:
            stop.set()
            aborter.join(timeout=30)
    message = str(raised.value)
    assert f"{limit} groups in a row were aborted" in message
    assert url in message and "3 times" in message
    assert not batch_path(tmp_path / "run", 1).exists()  # no batch made of cut-short groups
