from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from asyncrl.transport.broadcast import (
    STABLE,
    latest_broadcast,
    publish_weights,
    read_broadcast,
    stable_steps,
)
from asyncrl.transport.fingerprint import weights_fingerprint


def test_full_weights_broadcast_is_loadable_and_fingerprinted(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    broadcast = publish_weights(tmp_path, 1, model, keep=3)
    marker = json.loads((broadcast.path / STABLE).read_text())
    assert marker["step"] == 1 and marker["kind"] == "full"
    assert marker["fingerprint"] == weights_fingerprint(model.named_parameters())
    reloaded = AutoModelForCausalLM.from_pretrained(broadcast.path, dtype=torch.float32)
    assert weights_fingerprint(reloaded.named_parameters()) == marker["fingerprint"]
    assert read_broadcast(broadcast.path) == broadcast


def test_lora_broadcast_holds_only_the_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))
    broadcast = publish_weights(tmp_path, 4, model, keep=3)
    assert broadcast.kind == "lora"
    assert (broadcast.path / "adapter_config.json").exists()
    assert not (broadcast.path / "model.safetensors").exists()


def test_old_broadcasts_are_pruned_and_incomplete_ones_ignored(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for step in range(1, 6):
        publish_weights(tmp_path, step, model, keep=3)
    assert stable_steps(tmp_path) == [3, 4, 5]
    (tmp_path / "broadcasts" / "step_9").mkdir()  # a writer that crashed before STABLE
    assert read_broadcast(tmp_path / "broadcasts" / "step_9") is None
    assert latest_broadcast(tmp_path).step == 5
    assert latest_broadcast(tmp_path, at_least=6) is None


def test_no_broadcast_is_pruned_while_servers_load_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Pruning used to delete the step a server was reading; now it waits for the next publish
    while the orchestrator holds the broadcasts in use (a real flock, from another process)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    publish_weights(tmp_path, 1, model, keep=1)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_IN_USE, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        publish_weights(tmp_path, 2, model, keep=1)
        publish_weights(tmp_path, 3, model, keep=1)
        assert stable_steps(tmp_path) == [1, 2, 3]  # nothing pruned while loading
    finally:
        holder.kill()
        holder.wait()
    publish_weights(tmp_path, 4, model, keep=1)
    assert stable_steps(tmp_path) == [4]


HOLD_IN_USE = """
import asyncio, sys, time
from asyncrl.transport.broadcast import broadcasts_in_use

async def hold():
    async with broadcasts_in_use(sys.argv[1]):
        print("held", flush=True)
        time.sleep(60)

asyncio.run(hold())
"""


def test_pruning_keeps_every_nth_steps_weights_beside_the_newest(tmp_path: Path) -> None:
    from asyncrl.transport.broadcast import prune, stable_steps

    for step in range(1, 11):
        marker = tmp_path / "broadcasts" / f"step_{step}" / "STABLE"
        marker.parent.mkdir(parents=True)
        marker.write_text("{}")
    prune(tmp_path, keep=2, keep_every=4)
    assert stable_steps(tmp_path) == [4, 8, 9, 10]
