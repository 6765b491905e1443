"""verifiers' own environments run as they are, end to end against SmolLM2 on the embedded
engine: single-turn (`echo-v1`), multi-turn with a scripted user (`echo-user-sim-v1`), and with
MCP tools (`counter-tool-v1`), each episode played by the environment's own rollout logic in
a worker process, every policy turn generated through the token gate, and each episode made a
training sample whose model tokens are exactly the sampled ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.verifiers.helpers import Played, play
from transformers import AutoTokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def model_tokens_are_the_gates(played: Played) -> None:
    for group in played.groups:
        for sample in group.samples:
            assert not sample.problems()
            trained = [lp for lp, m in zip(sample.inference_logprobs, sample.completion_mask,
                                           strict=True) if m]  # fmt: skip
            assert all(lp <= 0.0 for lp in trained)
            assert all(v == 0 for v in sample.policy_versions)


def test_a_single_turn_environment_trains_its_sampled_answer(
    smollm2_dir: Path, smollm2_server: str, verifiers_fixtures: Path
) -> None:
    played = play(smollm2_dir, smollm2_server, {"id": "echo-v1"}, groups=1, rollouts=2)
    (group,) = played.groups
    assert len(group.samples) == 2 and group.turns == [1, 1]
    assert all(set(values) == {"echoed"} for values in group.values)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    for sample in group.samples:
        prompt = tokenizer.decode(sample.prompt_ids)
        assert "Repeat the user's message back to them exactly" in prompt  # its system prompt
        assert prompt.endswith("<|im_start|>assistant\n")
        assert all(sample.completion_mask)  # one turn: every completion token was sampled
    model_tokens_are_the_gates(played)
    assert played.pool.failures == {}
    assert played.metrics["orchestrator/verifiers/echo-v1/stop/agent_completed"] == 2
