"""The trainer against the real embedded server: logprob agreement, a real `asyncrl train`
process, non-finite steps skipped, and LoRA broadcasts that the server reproduces."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import httpx
import msgspec
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from asyncrl.launch.inference_process import inference_server
from asyncrl.monitor.metrics import read_metrics
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.transport.batches import write_batch
from asyncrl.transport.broadcast import STABLE, stable_steps
from asyncrl.transport.fingerprint import weights_fingerprint
from asyncrl.types import TrainingBatch

from .rollouts import sample_batch

pytestmark = pytest.mark.integration

PROMPTS = ["the quick", "zz", "brown fox jumps"]


def trainer_logprobs(model: torch.nn.Module, batch: TrainingBatch) -> tuple[torch.Tensor, ...]:
    micro_batches = build_micro_batches(batch, 256, 64, 0, "token")
    with torch.no_grad():
        current = torch.cat(
            [completion_logprobs(model, mb.packed, mb.temperature).logprobs for mb in micro_batches]
        )
    served = torch.cat([mb.inference_logprobs for mb in micro_batches])
    return current, served


def test_step_zero_mismatch_kl_with_embedded_inference_is_below_1e_5(
    server_url: str, tiny_model_dir: Path
) -> None:
    batch = sample_batch(server_url, str(tiny_model_dir), PROMPTS, step=1, n=3, temperature=0.7)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    current, served = trainer_logprobs(model, batch)
    log_ratio = (current - served).double()
    mismatch_kl = float((torch.exp(log_ratio) - 1 - log_ratio).mean())
    assert mismatch_kl <= 1e-5
    assert float(log_ratio.abs().max()) <= 1e-5


def run_train(model_dir: Path, output_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "asyncrl.cli", "train", "--model", str(model_dir),
        "--output_dir", str(output_dir), "--optimizer", "adamw", "--recipe", "fp32",
        "--learning_rate", "1e-3", "--sequence_len", "256", "--max_async_level", "1",
        *overrides,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_trainer_skips_a_non_finite_step_and_keeps_training(
    server_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "outputs" / "run_default"
    poisoned = sample_batch(server_url, str(tiny_model_dir), PROMPTS, step=1)
    nan_samples = [
        msgspec.structs.replace(s, advantages=[math.nan] * len(s.advantages))
        for s in poisoned.samples
    ]
    write_batch(run_dir, TrainingBatch(step=1, samples=nan_samples))
    write_batch(run_dir, sample_batch(server_url, str(tiny_model_dir), PROMPTS, step=2))
    write_batch(run_dir, sample_batch(server_url, str(tiny_model_dir), PROMPTS, step=3))

    result = run_train(tiny_model_dir, tmp_path / "outputs", "--max_steps", "3", "--lora", "false")
    assert result.returncode == 0, result.stderr[-3000:]

    records = read_metrics(run_dir / "metrics.jsonl", role="trainer")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["trainer/skipped_updates"] for r in records] == [1, 0, 0]
    assert records[1]["trainer/loss_tokens"] == 6 * 12
    assert stable_steps(run_dir) == [1, 2, 3]  # keep = max_async_level + 2 = 3

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    step_one = AutoModelForCausalLM.from_pretrained(run_dir / "broadcasts" / "step_1")
    step_two = AutoModelForCausalLM.from_pretrained(run_dir / "broadcasts" / "step_2")
    fingerprint = weights_fingerprint
    assert fingerprint(step_one.named_parameters()) == fingerprint(initial.named_parameters())
    assert fingerprint(step_two.named_parameters()) != fingerprint(initial.named_parameters())
    assert (run_dir / "broadcasts" / "step_2" / STABLE).exists()


def test_lora_broadcast_loaded_by_the_server_reproduces_trainer_logprobs(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    run_dir = outputs / "run_default"
    with inference_server(
        tiny_model_dir, "--max_model_len", "256", "--weight_roots", f"[{outputs}]"
    ) as url:
        batch = sample_batch(url, str(tiny_model_dir), PROMPTS, step=1, temperature=0.9)
        write_batch(run_dir, batch)
        result = run_train(
            tiny_model_dir, outputs, "--max_steps", "1", "--lora", "true", "--lora_rank", "4",
            "--learning_rate", "5e-2",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        adapter_dir = run_dir / "broadcasts" / "step_1"
        load = {"lora_name": "policy", "lora_path": str(adapter_dir)}
        assert httpx.post(f"{url}/v1/load_lora_adapter", json=load).status_code == 200
        assert httpx.get(f"{url}/weight_info").json()["version"] == 1
        after = sample_batch(url, "policy", PROMPTS, step=2, temperature=0.9, seed=4)

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trained = PeftModel.from_pretrained(base, adapter_dir).eval()
    current, served = trainer_logprobs(trained, after)
    assert float((current - served).abs().max()) <= 1e-5
    # and the adapter really moved the policy away from the base
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    untrained, _ = trainer_logprobs(plain, after)
    assert float((untrained - served).abs().max()) > 1e-3


@pytest.mark.parametrize("lora", ["false", "true"])
def test_kl_to_a_reference_model_and_several_iterations_per_batch(
    server_url: str, tiny_model_dir: Path, tmp_path: Path, lora: str
) -> None:
    """The β·KL path (reference copy, or adapters disabled with LoRA) and three optimizer steps
    per batch run through the real `asyncrl train`; the reference values themselves are pinned
    in tests/unit/trainer/test_reference.py."""
    run_dir = tmp_path / "outputs" / "run_default"
    write_batch(run_dir, sample_batch(server_url, str(tiny_model_dir), PROMPTS, step=1))
    result = run_train(
        tiny_model_dir, tmp_path / "outputs", "--max_steps", "1", "--lora", lora,
        "--loss.type", "grpo_clip", "--loss.beta", "0.5", "--num_iterations", "3",
        "--learning_rate", "2e-2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    record = read_metrics(run_dir / "metrics.jsonl", role="trainer")[0]
    assert record["trainer/skipped_updates"] == 0
    assert math.isfinite(record["trainer/loss"]) and record["trainer/grad_norm"] > 0
    assert stable_steps(run_dir) == [1]


def test_trainer_reads_batches_over_zmq_and_stops_at_the_end(
    server_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from asyncrl.config.transport import RolloutTransportConfig
    from asyncrl.launch.inference_process import free_port
    from asyncrl.transport.rollout_transport import batch_sender

    outputs = tmp_path / "outputs"
    run_dir = outputs / "run_default"
    run_dir.mkdir(parents=True)
    port = free_port()
    sender = batch_sender(RolloutTransportConfig(type="zmq", host="127.0.0.1", port=port), run_dir)
    command = [
        sys.executable, "-m", "asyncrl.cli", "train", "--model", str(tiny_model_dir),
        "--output_dir", str(outputs), "--optimizer", "adamw", "--recipe", "fp32",
        "--lora", "false", "--transport_type", "zmq", "--rollout_transport.host", "127.0.0.1",
        "--rollout_transport.port", str(port),
    ]  # fmt: skip
    trainer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for step in (1, 2):
            sender.send(sample_batch(server_url, str(tiny_model_dir), PROMPTS, step=step))
        sender.finish()  # max_steps is -1: the end-of-run message stops the trainer
        output, _ = trainer.communicate(timeout=300)
    finally:
        trainer.kill()
    assert trainer.returncode == 0, output[-3000:]
    assert stable_steps(run_dir) == [1, 2]
    assert "the orchestrator is done" in output
