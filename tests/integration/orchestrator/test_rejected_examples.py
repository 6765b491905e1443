"""One example the server refuses costs that example, not the run (issue 60: one JSONL line
among 81 good ones stopped `asyncrl rl` in 25 s, rc 1, no step).

A real embedded server whose context (max_model_len 64) is shorter than the orchestrator's
seq_len, so a line passes start-up and only the server can refuse it; the real orchestrator
loop. With no trainer the run then ends at the final wait for weights, which has a deadline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.launch.inference_process import inference_server
from asyncrl.orchestrator.orchestrator import Orchestrator
from asyncrl.run.layout import metrics_file
from asyncrl.transport.batches import batch_path

pytestmark = pytest.mark.integration


def test_an_example_the_server_refuses_is_skipped_and_counted_and_the_run_goes_on(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "d.jsonl"
    lines = [{"input": "abc", "answer": "cba"}, {"input_token_ids": [5] * 100, "answer": "x"}]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = tmp_path / "run"
    with inference_server(tiny_model_dir, "--max_model_len", "64") as url:
        config = OrchestratorConfig(
            model={"name": str(tiny_model_dir)},
            env=[{"id": "jsonl", "args": {"path": str(data), "eval_path": str(data),
                                          "reward": "lcs"}}],
            batch_size=2, rollouts_per_example=2, max_steps=2, max_async_level=2,
            output_dir=str(run), client={"base_url": [f"{url}/v1"]},
            sampling={"max_tokens": 8}, ckpt={"wait_for_weights_timeout": 1},
            eval={"interval": 1, "num_examples": 2, "rollouts_per_example": 1},
        )  # fmt: skip
        with pytest.raises(TimeoutError) as raised:  # the buffer cycles: line 2 is drawn
            asyncio.run(asyncio.wait_for(Orchestrator(config).run(), timeout=240))
    assert "gave up waiting for weights version 2 from the trainer after 1 s" in str(raised.value)
    assert "orchestrator.ckpt.wait_for_weights_timeout" in str(raised.value)
    assert batch_path(run, 1).exists() and batch_path(run, 2).exists()
    records = [json.loads(line) for line in metrics_file(run).read_text().splitlines()]
    rejected = sum(r.get("orchestrator/rejected_examples", 0) for r in records)
    assert rejected >= 1
    skipped = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    assert len(skipped) == 1 and f"{data}:2 is skipped" in skipped[0]
    assert "prompt has 100 tokens; max_model_len is 64" in skipped[0]
    # the held-out split holds the same refused line: the eval leaves it out, and still records
    evals = [r for r in records if "eval/jsonl/num_examples" in r]
    assert evals and all(r["eval/jsonl/num_examples"] == 1 for r in evals)
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert left_out and f"{data}:2" in left_out[0]
