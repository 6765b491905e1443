"""A real `asyncrl infer` process whose every engine step fails (fault injected: the model's
forward raises, as it did under transformers 5.24 with the old KV cache): it answers the first
requests as aborted, then reports itself unhealthy and exits non-zero with the reason, so a
supervisor restarts it or stops the run naming it, instead of aborting requests forever behind
a green /health."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from asyncrl.inference.engine_thread import FAILED_STEPS_BEFORE_GIVING_UP
from asyncrl.launch.inference_process import free_port
from asyncrl.processes import wait_healthy

pytestmark = pytest.mark.integration

INJECTED = """
import sys
from asyncrl.inference import engine as engine_module
from asyncrl.cli import main

built = engine_module.Engine.__init__

def build_failing(self, *args, **kwargs):
    built(self, *args, **kwargs)

    def forward(*args, **kwargs):
        raise TypeError("injected: update() got an unexpected keyword argument 'kwargs'")

    self.model.forward = forward

engine_module.Engine.__init__ = build_failing
sys.exit(main(sys.argv[1:]))
"""


def test_a_server_whose_steps_all_fail_exits_with_the_reason(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "infer.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", INJECTED, "infer", "--model", str(tiny_model_dir),
             "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_healthy(url, process, 120)
        body = {"prompt": "go", "max_tokens": 4, "return_token_ids": True}
        for _ in range(FAILED_STEPS_BEFORE_GIVING_UP):
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert response.json()["choices"][0]["finish_reason"] == "abort"
        assert process.wait(timeout=60) == 1
    finally:
        process.kill()
        process.wait()
    said = log.read_text()
    stopped = "asyncrl infer: the inference server stopped: "
    assert f"{stopped}{FAILED_STEPS_BEFORE_GIVING_UP} engine steps in a row failed" in said
    assert "TypeError: injected" in said
