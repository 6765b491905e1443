"""Weight reload over HTTP: full checkpoints and LoRA adapters, checked by logprob parity."""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from asyncrl.config.init_model import InitModelConfig
from asyncrl.launch.inference_process import inference_server
from asyncrl.models.init_model import init_model
from asyncrl.transport.fingerprint import weights_fingerprint

pytestmark = pytest.mark.integration

PROMPTS = ["the cat", "zq", "reverse me"]
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("broadcasts")


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path, roots: Path) -> Iterator[str]:
    with inference_server(
        tiny_model_dir, "--max_model_len", "128", "--weight_roots", f"[{roots}]"
    ) as server:
        yield server


def served_logprob_gap(url: str, model_name: str, reference: torch.nn.Module) -> float:
    """Largest |server logprob - reference forward logprob| over sampled tokens."""
    body = {
        "model": model_name, "prompt": PROMPTS, "n": 2, "max_tokens": 10, "seed": 3,
        "temperature": TEMPERATURE, "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
    }  # fmt: skip
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    worst = 0.0
    for choice in response.json()["choices"]:
        prompt, output = choice["prompt_token_ids"], choice["token_ids"]
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + output])).logits[0].float()
        logprobs = torch.log_softmax(logits / TEMPERATURE, dim=-1)
        for position, token in enumerate(output):
            expected = logprobs[len(prompt) + position - 1, token].item()
            worst = max(worst, abs(expected - choice["logprobs"]["token_logprobs"][position]))
    return worst


def make_adapter(base_dir: Path, out: Path, seed: int) -> torch.nn.Module:
    """A PEFT LoRA adapter with random (non-zero) A and B; returns the merged reference model."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False,
    )  # fmt: skip
    peft_model = get_peft_model(base, config)
    peft_model.save_pretrained(out)
    return peft_model.merge_and_unload().eval()


def test_full_weight_update_serves_the_new_checkpoint(
    url: str, tiny_model_dir: Path, roots: Path
) -> None:
    new_dir = init_model(InitModelConfig(preset="tiny", output_dir=str(roots / "step_7"), seed=123))
    new_model = AutoModelForCausalLM.from_pretrained(new_dir, dtype=torch.float32).eval()
    old_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    name = str(tiny_model_dir)
    assert served_logprob_gap(url, name, old_model) <= 1e-5
    before = httpx.get(f"{url}/weight_info").json()

    response = httpx.post(f"{url}/update_weights", json={"weight_dir": str(new_dir)}, timeout=60)
    assert response.status_code == 200, response.text
    info = httpx.get(f"{url}/weight_info").json()
    assert info["version"] == 7  # read from step_7
    assert info["fingerprint"] == weights_fingerprint(new_model.named_parameters())
    assert info["fingerprint"] != before["fingerprint"]
    assert served_logprob_gap(url, name, new_model) <= 1e-5
    assert served_logprob_gap(url, name, old_model) > 1e-2  # really different weights

    # back to the original, with an explicit version
    original = roots / "step_8"
    restored = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    restored.save_pretrained(original)
    httpx.post(f"{url}/update_weights", json={"weight_dir": str(original), "version": 80})
    assert httpx.get(f"{url}/weight_info").json()["version"] == 80
    assert served_logprob_gap(url, name, old_model) <= 1e-5


def test_lora_adapter_serves_base_plus_adapter_and_reloads_in_place(
    url: str, tiny_model_dir: Path, roots: Path
) -> None:
    name = str(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    merged_one = make_adapter(tiny_model_dir, roots / "lora_1", seed=1)
    merged_two = make_adapter(tiny_model_dir, roots / "lora_2", seed=2)

    load = {"lora_name": "policy", "lora_path": str(roots / "lora_1")}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=load).status_code == 200
    assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == [name, "policy"]
    assert served_logprob_gap(url, "policy", merged_one) <= 1e-5

    # in place: the second adapter replaces the first, it does not stack on it
    again = {"lora_name": "policy", "lora_path": str(roots / "lora_2"), "load_inplace": True}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=again).status_code == 200
    assert served_logprob_gap(url, "policy", merged_two) <= 1e-5

    # while merged, the base name is refused rather than answered with adapter weights
    refused = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "a"})
    assert refused.status_code == 400 and "policy" in refused.json()["error"]["message"]

    unload = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "policy"})
    assert unload.status_code == 200
    assert served_logprob_gap(url, name, base) <= 1e-5


def test_paths_outside_the_weight_roots_are_refused(url: str, tiny_model_dir: Path) -> None:
    response = httpx.post(f"{url}/update_weights", json={"weight_dir": str(tiny_model_dir)})
    assert response.status_code == 400
    assert "outside the allowed weight roots" in response.json()["error"]["message"]
    escape = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/etc"})
    assert escape.status_code == 400


def test_a_directory_that_does_not_fit_the_model_is_refused_and_nothing_changes(
    url: str, roots: Path, tiny_model_dir: Path
) -> None:
    before = httpx.get(f"{url}/weight_info").json()
    other = init_model(InitModelConfig(preset="small", output_dir=str(roots / "step_99")))
    response = httpx.post(f"{url}/update_weights", json={"weight_dir": str(other)})
    assert response.status_code == 400
    assert "does not fit the model" in response.json()["error"]["message"]

    # same names, one tensor of another shape: refused before any tensor is copied
    tensors = load_file(tiny_model_dir / "model.safetensors")
    tensors["model.norm.weight"] = torch.zeros(7)
    tensors["model.embed_tokens.weight"] = torch.zeros_like(tensors["model.embed_tokens.weight"])
    (roots / "step_98").mkdir()
    save_file(tensors, roots / "step_98" / "model.safetensors")
    response = httpx.post(f"{url}/update_weights", json={"weight_dir": str(roots / "step_98")})
    assert response.status_code == 400 and "shape mismatch" in response.json()["error"]["message"]
    assert httpx.get(f"{url}/weight_info").json() == before


def test_shard_names_and_symlinks_cannot_reach_outside_the_roots(
    url: str, roots: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Only the directory used to be checked: an index naming `../../outside` shards, or a
    symlinked `*.safetensors`, loaded weights from anywhere."""
    before = httpx.get(f"{url}/weight_info").json()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.safetensors").write_bytes((tiny_model_dir / "model.safetensors").read_bytes())
    indexed = roots / "step_50"
    indexed.mkdir()
    escape = os.path.relpath(outside / "model.safetensors", indexed)  # ../../…/outside/…
    weight_map = {"model.norm.weight": escape}
    (indexed / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert (indexed / weight_map["model.norm.weight"]).resolve().exists()  # it does escape
    linked = roots / "step_51"
    linked.mkdir()
    (linked / "model.safetensors").symlink_to(outside / "model.safetensors")
    for directory in (indexed, linked):
        response = httpx.post(f"{url}/update_weights", json={"weight_dir": str(directory)})
        assert response.status_code == 400, response.text
        assert "outside the allowed weight roots" in response.json()["error"]["message"]
    assert httpx.get(f"{url}/weight_info").json() == before


def tampered_adapter(
    source: Path, target: Path, config: dict | str | None = None, **tensors: torch.Tensor
) -> Path:
    """A copy of the adapter in `source` with its config or some tensors replaced."""
    target.mkdir()
    data = load_file(source / "adapter_model.safetensors")
    data.update({key.replace("__", "."): value for key, value in tensors.items()})
    save_file(data, target / "adapter_model.safetensors")
    original = json.loads((source / "adapter_config.json").read_text())
    if isinstance(config, dict):
        original.update(config)
    text = config if isinstance(config, str) else json.dumps(original)
    (target / "adapter_config.json").write_text(text)
    return target


def test_a_bad_lora_adapter_is_refused_whole_and_nothing_changes(
    url: str, roots: Path, tiny_model_dir: Path
) -> None:
    """A failure half-way used to leave some deltas applied under the old fingerprint, and
    wrong shapes that broadcast loaded silently; a missing `r` or bad JSON gave 500."""
    source = roots / "lora_good"
    make_adapter(tiny_model_dir, source, seed=5)
    keys = sorted(load_file(source / "adapter_model.safetensors"))
    last_b = next(key for key in reversed(keys) if ".lora_B." in key)  # fails after the others
    rank = 4
    out_features = load_file(source / "adapter_model.safetensors")[last_b].shape[0]
    before = httpx.get(f"{url}/weight_info").json()
    cases = {
        "bad_json": ({}, "{not json", "not readable JSON"),
        "no_rank": ({}, {"r": None}, "`r` must be a positive integer"),
        "zero_rank": ({}, {"r": 0}, "`r` must be a positive integer"),
        "broadcastable": ({last_b: torch.ones(1, rank)}, None, "needs"),
        "wrong_rank": ({last_b: torch.ones(out_features, rank + 1)}, None, "needs"),
        "not_finite": ({last_b: torch.full((out_features, rank), math.inf)}, None, "not finite"),
    }
    for name, (tensors, config, message) in cases.items():
        adapter = tampered_adapter(
            source,
            roots / f"lora_{name}",
            config,
            **{k.replace(".", "__"): v for k, v in tensors.items()},
        )
        load = {"lora_name": "policy", "lora_path": str(adapter)}
        response = httpx.post(f"{url}/v1/load_lora_adapter", json=load)
        assert response.status_code == 400, (name, response.text)
        assert message in response.json()["error"]["message"], name
        assert httpx.get(f"{url}/weight_info").json() == before, name
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == [
            str(tiny_model_dir)
        ]


def running_requests(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(r"^asyncrl:num_requests_running\S* (\S+)$", text, re.M)[1])


def test_every_token_reports_the_weights_version_that_sampled_it(
    url: str, tiny_model_dir: Path, roots: Path
) -> None:
    """A long request keeps running across a weight update: tokens before it carry the old
    version, tokens after it the new one (an asyncrl extension field, `policy_versions`)."""
    body = {"prompt": "go", "max_tokens": 120, "ignore_eos": True, "return_token_ids": True,
            "temperature": 1.0, "seed": 1}  # fmt: skip
    update_dir = roots / "step_41"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(update_dir)
    start = httpx.get(f"{url}/weight_info").json()["version"]
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=60)
        while running_requests(url) < 1:
            time.sleep(0.005)
        httpx.post(f"{url}/update_weights", json={"weight_dir": str(update_dir)}, timeout=60)
        choice = pending.result().json()["choices"][0]
    versions = choice["policy_versions"]
    assert len(versions) == len(choice["token_ids"]) == 120
    assert versions == sorted(versions)  # never goes back
    assert versions[0] == start and versions[-1] == 41
