"""The SGLang backend, end to end against a STAND-IN server (SGLang has no CPU build here):
`asyncrl infer --backend sglang` launches `python -m sglang.launch_server`, which resolves to
the stand-in in `sglang_stand_in/`, and the orchestrator's client drives it. What this proves:
the launcher, the engine identification, the /generate translation and the order of the
update calls. Untested against real SGLang until a GPU run."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.init_model import InitModelConfig
from asyncrl.config.orchestrator import ClientConfig
from asyncrl.launch.inference_process import inference_server
from asyncrl.models.init_model import init_model
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.engine_api import chat_template
from asyncrl.orchestrator.rollout import Completion
from asyncrl.transport.broadcast import Broadcast

pytestmark = pytest.mark.integration

STAND_IN = Path(__file__).parent / "sglang_stand_in"
TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sglang")


@pytest.fixture(scope="module")
def model_dir(root: Path) -> Path:
    return init_model(InitModelConfig(preset="tiny", output_dir=str(root / "base")))


@pytest.fixture(scope="module")
def url(model_dir: Path) -> Iterator[str]:
    path = os.pathsep.join([str(STAND_IN), os.environ.get("PYTHONPATH", "")])
    with inference_server(
        model_dir, "--backend", "sglang", "--executable", sys.executable,
        env={"PYTHONPATH": path},
    ) as server:  # fmt: skip
        yield server


def with_pool(url: str, model: Path, action: Any, **client: Any) -> Any:
    async def run() -> Any:
        tokenizer = AutoTokenizer.from_pretrained(model)
        config = ClientConfig(base_url=[f"{url}/v1"], **client)
        pool = ClientPool(config, chat_prompt_ids=chat_template(tokenizer))
        try:
            await pool.start(str(model))
            return await action(pool, pool.servers[0])
        finally:
            await pool.close()

    return asyncio.run(run())


def calls(url: str) -> list[Any]:
    return httpx.get(f"{url}/calls").json()


def check_logprobs(completions: list[Completion], model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for completion in completions:
        ids = completion.prompt_ids + completion.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0] / TEMPERATURE
        logprobs = torch.log_softmax(logits, dim=-1)
        start = len(completion.prompt_ids) - 1
        expected = [logprobs[start + i, t].item() for i, t in enumerate(completion.token_ids)]
        assert completion.logprobs == pytest.approx(expected, abs=1e-5)


def test_chat_generation_goes_through_generate_and_parses_as_openai(
    url: str, model_dir: Path
) -> None:
    messages = [{"role": "user", "content": "reverse: abc"}]
    body = {"model": str(model_dir), "messages": messages, "n": 3, "max_tokens": 6,
            "temperature": TEMPERATURE, "logprobs": True}  # fmt: skip

    async def generate(pool: ClientPool, server: Any) -> Any:
        assert (await pool.api(server)).name == "sglang"
        return await pool.generate(server, "chat/completions", body, cost=3)

    response = with_pool(url, model_dir, generate)
    completions = [Completion.parse(choice, response) for choice in response["choices"]]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert [c.index for c in completions] == [0, 1, 2]
    assert all(c.prompt_ids == expected and 1 <= len(c.token_ids) <= 6 for c in completions)
    check_logprobs(completions, model_dir)


def test_full_update_loads_from_disk_then_flushes_the_cache(
    url: str, model_dir: Path, root: Path
) -> None:
    new = init_model(InitModelConfig(preset="tiny", seed=5, output_dir=str(root / "new")))
    before = len(calls(url))

    async def load(pool: ClientPool, server: Any) -> Any:
        await pool.load(Broadcast(3, "full", "", new), "adapter")
        body = {"model": str(model_dir), "prompt": [5, 6, 7], "n": 2, "max_tokens": 5,
                "temperature": TEMPERATURE}  # fmt: skip
        return pool.oldest_version(), await pool.generate(server, "completions", body, cost=2)

    version, response = with_pool(url, model_dir, load, pause_for_updates="keep")
    assert version == 3
    assert [call[0] for call in calls(url)[before:]] == [
        "pause_generation", "update_weights_from_disk", "flush_cache", "continue_generation",
    ]  # fmt: skip
    assert calls(url)[before][1] == {"mode": "in_place"}
    check_logprobs([Completion.parse(c, response) for c in response["choices"]], new)


def test_lora_update_replaces_the_adapter_under_its_name(url: str, model_dir: Path) -> None:
    before = len(calls(url))

    async def load(pool: ClientPool, server: Any) -> None:
        await pool.load(Broadcast(4, "lora", "", Path("/adapters/step_4")), "policy")

    with_pool(url, model_dir, load)
    assert calls(url)[before:] == [
        ["unload_lora_adapter", {"lora_name": "policy"}],
        ["load_lora_adapter", {"lora_name": "policy", "lora_path": "/adapters/step_4"}],
        ["flush_cache", None],
    ]


def test_the_api_key_reaches_sglang_but_no_command_line(model_dir: Path) -> None:
    """`ps` shows every user each process's command line: the key must not be on it."""
    key = "sglang-key-of-this-test-0123"
    path = os.pathsep.join([str(STAND_IN), os.environ.get("PYTHONPATH", "")])
    with inference_server(
        model_dir, "--backend", "sglang", "--executable", sys.executable,
        env={"PYTHONPATH": path, "VLLM_API_KEY": key},
    ) as server:  # fmt: skip
        assert httpx.get(f"{server}/v1/models").status_code == 401
        authorized = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{server}/v1/models", headers=authorized).status_code == 200
        shown = []
        for process in Path("/proc").iterdir():
            try:
                shown.append((process / "cmdline").read_bytes())
            except OSError:
                continue
        launched = [
            c for c in shown if b"sglang.launch_server" in c and str(model_dir).encode() in c
        ]
        assert launched and not [c for c in shown if key.encode() in c]
        config = launched[0].split(b"\0")
        if b"--config" in config:  # read at start-up, then removed: no copy left on disk
            assert not Path(config[config.index(b"--config") + 1].decode()).exists()
