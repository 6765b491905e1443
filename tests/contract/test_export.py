"""`asyncrl export` turns a LoRA run's broadcast into a model directory that transformers,
`asyncrl eval` and vLLM-CPU load with no other argument, with the run's own weights: logprobs
equal to the adapter applied on its base (PEFT, unmerged) and to what vLLM serves from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from tests.contract.conftest import REPO, required_vllm_python, run_rl, tiny_model
from tests.contract.reference import complete, worst_logprob_gap
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.launch.inference_process import free_port, inference_server

pytestmark = [pytest.mark.integration, pytest.mark.contract, pytest.mark.slow]

TOKENS = [5, 17, 40, 23, 61, 8, 33, 12, 70, 44]


@torch.no_grad()
def logprobs(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([TOKENS])
    return torch.log_softmax(model(ids).logits.float(), dim=-1)[0, :-1].gather(
        -1, ids[0, 1:, None]
    )[:, 0]


def test_an_exported_lora_run_loads_anywhere_with_the_runs_weights(tmp_path: Path) -> None:
    base = tiny_model(tmp_path / "base", tied=True)  # the real model's case: a tied head
    output = tmp_path / "run"
    run_rl({
        "model": str(base), "output_dir": str(output), "seq_len": 256, "max_steps": 2,
        "inference": {"port": free_port(), "max_num_seqs": 32},
        "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 8,
                         "rollouts_per_example": 4, "sampling": {"max_tokens": 12}},
        "trainer": {"lora": True, "optimizer": "adamw", "recipe": "fp32", "learning_rate": 3e-2},
    }, tmp_path)  # fmt: skip
    exported = tmp_path / "exported"
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "export", "--source", str(output),
         "--output_dir", str(exported)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    adapter = output / "run_default" / "broadcasts" / "step_2"
    assert json.loads((exported / "asyncrl_export.json").read_text())["source"] == str(
        adapter.resolve()
    )

    # transformers, with nothing but the directory: the adapter's weights, merged
    model = AutoModelForCausalLM.from_pretrained(exported).eval()
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    untrained = AutoModelForCausalLM.from_pretrained(base).eval()
    assert (logprobs(model) - logprobs(reference.eval())).abs().max() <= 1e-5
    assert (logprobs(model) - logprobs(untrained)).abs().max() >= 1e-3  # the run moved it
    tokenizer = AutoTokenizer.from_pretrained(exported)  # tokenizer and chat template in
    assert tokenizer.apply_chat_template([{"role": "user", "content": "abc"}], tokenize=False)

    # asyncrl eval, with only --model
    scored = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "eval", "--model", str(exported), "--env.id",
         "reverse-text", "--num_examples", "4", "--max_tokens", "8"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert scored.returncode == 0 and "mean_reward" in scored.stdout, scored.stderr[-3000:]

    # vLLM-CPU, started on the directory alone: what it samples, scored by the export
    args = ["--backend", "vllm", "--executable", required_vllm_python(), "--dtype", "float32",
            "--max_model_len", "256", "--enforce_eager", "true",
            "--kv_cache_memory_bytes", str(64 << 20), "--max_num_seqs", "16"]  # fmt: skip
    with inference_server(exported, *args, log_path=tmp_path / "vllm.log",
                          startup_timeout=600) as url:  # fmt: skip
        response = complete(url, {
            "model": str(exported), "prompt": [TOKENS[:4], TOKENS[4:8]], "max_tokens": 8,
            "temperature": 1.0, "seed": 3, "logprobs": 0, "return_token_ids": True,
            "ignore_eos": True,
        })  # fmt: skip
    gap = worst_logprob_gap(response["choices"], lambda c: c["prompt_token_ids"], model, 1.0)
    assert gap <= 1e-5  # the engine contract's bar (test_generation.py)
