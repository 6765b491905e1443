"""A sequence-classification reward model as a rubric term: scored in its own process, batched
over a group, equal to a direct forward pass of the same model on the same texts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from asyncrl.config.base import ConfigError
from asyncrl.config.init_model import InitModelConfig
from asyncrl.config.model_rewards import RewardModelTermConfig
from asyncrl.envs import load_environment
from asyncrl.envs.base import Example
from asyncrl.envs.model_rewards.items import ScoreItem
from asyncrl.envs.model_rewards.pool import ModelRewardPool, model_reward_metrics
from asyncrl.envs.model_rewards.scorer_process import ScorerProcess
from asyncrl.envs.reverse_text import lcs_ratio
from asyncrl.envs.reward_pool import RewardPool
from asyncrl.models.init_model import init_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = [{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": "abc de"}]
COMPLETIONS = ["ed cba", "xyz", "a much longer completion than the others, to be padded", ""]


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("models") / "tiny-rm"
    return init_model(
        InitModelConfig(preset="tiny", output_dir=str(output), head="sequence-classification")
    )


def direct_scores(model_dir: Path, conversations: list[list[dict[str, str]]]) -> list[float]:
    """One text at a time, unpadded, in this process: the reference."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    scores = []
    for conversation in conversations:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            scores.append(model(input_ids=ids).logits[0, 0].item())
    return scores


async def scored(config: RewardModelTermConfig, items: list[ScoreItem]) -> tuple[list, object]:
    term = ScorerProcess(config)
    await term.start()
    try:
        results = await asyncio.gather(*(term.score(item) for item in items))
        return results, term.stats.take()
    finally:
        await term.close()


def test_reward_model_scores_equal_a_direct_forward_pass_in_one_batch(
    reward_model_dir: Path,
) -> None:
    items = [ScoreItem(PROMPT, completion, "ed cba", "reverse-text") for completion in COMPLETIONS]
    config = RewardModelTermConfig(model=str(reward_model_dir), batch_size=3)
    results, figures = asyncio.run(scored(config, items))
    conversations = [[*PROMPT, {"role": "assistant", "content": c}] for c in COMPLETIONS]
    expected = direct_scores(reward_model_dir, conversations)
    assert [r.failure for r in results] == [None] * len(items)
    assert [r.value for r in results] == pytest.approx(expected, abs=1e-5)
    assert len(set(expected)) == len(expected)  # the texts differ, so do their scores
    assert (figures.requests, figures.batch_items) == (1, len(items))  # the group, one batch
    assert figures.prompt_tokens > sum(len(c) for c in COMPLETIONS)


def test_an_episode_is_scored_as_its_whole_conversation(reward_model_dir: Path) -> None:
    episode = [
        *PROMPT,
        {"role": "assistant", "content": "ed"},
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": "ed cba"},
    ]
    example = Example(0, PROMPT, "ed cba", "reverse-text")
    item = ScoreItem.of(episode, example)
    assert item.completion == episode[len(PROMPT) :]
    results, _ = asyncio.run(scored(RewardModelTermConfig(model=str(reward_model_dir)), [item]))
    assert results[0].value == pytest.approx(
        direct_scores(reward_model_dir, [episode])[0], abs=1e-5
    )


def test_a_label_s_probability_is_the_score_of_a_model_with_several_labels(tmp_path: Path) -> None:
    model_dir = init_model(
        InitModelConfig(
            preset="tiny", output_dir=str(tmp_path / "rm"), head="sequence-classification"
        )
    )
    config = AutoConfig.from_pretrained(model_dir)
    config.num_labels = 3
    model = AutoModelForSequenceClassification.from_config(config)  # a 3-label head
    model.save_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    items = [ScoreItem(PROMPT, c, "", "t") for c in COMPLETIONS[:2]]
    results, _ = asyncio.run(scored(RewardModelTermConfig(model=str(model_dir), label=2), items))
    for item, result in zip(items, results, strict=True):
        text = tokenizer.apply_chat_template(item.conversation(), tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            probability = torch.softmax(model.eval()(input_ids=ids).logits[0], -1)[2].item()
        assert result.value == pytest.approx(probability, abs=1e-6)
    with pytest.raises(ConfigError, match="has 3 labels: set `label`"):
        asyncio.run(scored(RewardModelTermConfig(model=str(model_dir)), items))


def test_a_reward_model_term_is_weighted_into_the_rubric_and_logged_on_its_own(
    reward_model_dir: Path,
) -> None:
    example = Example(0, PROMPT, "ed cba", "reverse-text")
    config = RewardModelTermConfig(name="rm", weight=0.5, model=str(reward_model_dir))

    async def run() -> tuple[list, dict[str, float]]:
        rubric = load_environment("reverse-text").rubric
        rule = RewardPool("reverse-text", {}, rubric, num_workers=1)
        pool = ModelRewardPool(rule, [ScorerProcess(config)])
        await pool.start()
        try:
            results = await asyncio.gather(*(pool.score(c, example) for c in COMPLETIONS))
            return results, model_reward_metrics([pool, pool])
        finally:
            await pool.close()

    results, metrics = asyncio.run(run())
    conversations = [[*PROMPT, {"role": "assistant", "content": c}] for c in COMPLETIONS]
    model_scores = direct_scores(reward_model_dir, conversations)
    for completion, result, model_score in zip(COMPLETIONS, results, model_scores, strict=True):
        assert result.values["lcs_ratio"] == pytest.approx(lcs_ratio(completion, "ed cba"))
        assert result.values["rm"] == pytest.approx(model_score, abs=1e-5)
        assert result.reward == pytest.approx(result.values["lcs_ratio"] + 0.5 * model_score)
    assert metrics["orchestrator/model_reward/rm/scored"] == len(COMPLETIONS)
    assert metrics["orchestrator/model_reward/rm/failed/timeout"] == 0


def test_a_reward_model_that_cannot_load_stops_start_up_with_its_reason(tmp_path: Path) -> None:
    config = RewardModelTermConfig(name="rm", model=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"reward_model `rm` .* did not load"):
        asyncio.run(scored(config, []))
