from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from examples.judges.judge_data import write_judge_data

from asyncrl.config.init_model import InitModelConfig
from asyncrl.launch.inference_process import inference_server
from asyncrl.models.init_model import init_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="session")
def weight_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The only directory the shared server may read weight updates from."""
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="session")
def server_url(tiny_model_dir: Path, weight_root: Path) -> Iterator[str]:
    """One embedded server for the read-only tests of the session."""
    with inference_server(
        tiny_model_dir,
        "--max_model_len", "256",
        "--weight_roots", f"[{weight_root}]",
        "--max_request_bytes", "65536",
    ) as url:  # fmt: skip
        yield url


@pytest.fixture(scope="session")
def tiny_judge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny judge of reverse-text: `init-model`, then 30 steps of `asyncrl sft` (the example's
    config, made short) on `examples/judges/judge_data.py`'s practice data, in a process on one
    thread (≈ 10 s of CPU). It learns the answer's form, a verdict then a score ("n4"), and
    little of the grading: enough to read both ways, which is what tests need of it."""
    root = tmp_path_factory.mktemp("judge")
    base = init_model(InitModelConfig(preset="tiny", output_dir=str(root / "base")))
    data = write_judge_data(root / "data.jsonl", 400)
    command = [
        sys.executable, "-m", "asyncrl.cli", "sft", str(EXAMPLES / "judges" / "sft.yaml"),
        "--model", str(base), "--output_dir", str(root / "sft"),
        "--env.args", json.dumps({"path": str(data)}), "--num_examples", "400",
        "--max_steps", "30", "--per_device_train_batch_size", "4", "--learning_rate", "5e-3",
        "--warmup_steps", "3", "--eval_examples", "0",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "sft" / "final"
