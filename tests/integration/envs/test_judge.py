"""A generative judge against a real `asyncrl infer` serving a tiny judge model: at temperature 0
its scores of fixed completions are the same every time and equal what the model itself says,
read from its text (a number) and from its logprobs (the probability of a verdict token)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from examples.judges.judge_data import JUDGE_PROMPT
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.model_rewards import JudgeTermConfig
from asyncrl.envs.model_rewards.items import ScoreItem
from asyncrl.envs.model_rewards.judge import JudgeTerm
from asyncrl.envs.model_rewards.stats import Judged, TermFigures
from asyncrl.launch.inference_process import inference_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ATTEMPTS = [("abc de", "ed cba"), ("abc de", "xyz"), ("hello", "olleh"), ("hello", "hlleo")]
ITEMS = [
    ScoreItem([{"role": "user", "content": text}], completion, text[::-1], "reverse-text")
    for text, completion in ATTEMPTS
]


@pytest.fixture(scope="module")
def judge_url(tiny_judge_dir: Path) -> Iterator[str]:
    with inference_server(tiny_judge_dir, "--max_model_len", "256", startup_timeout=600) as url:
        yield url


def judge(url: str, read: str, **settings: object) -> JudgeTermConfig:
    return JudgeTermConfig(
        base_url=f"{url}/v1", prompt=JUDGE_PROMPT, read=read, scale=(0, 9),
        verdicts={"y": 1.0, "n": 0.0}, **settings,
    )  # fmt: skip


async def judged(
    config: JudgeTermConfig, items: list[ScoreItem]
) -> tuple[list[Judged], TermFigures]:
    term = JudgeTerm(config)
    await term.start()
    try:
        return list(await asyncio.gather(*(term.score(item) for item in items))), term.stats.take()
    finally:
        await term.close()


def prompt_ids(tokenizer: AutoTokenizer, item: ScoreItem) -> torch.Tensor:
    text = JUDGE_PROMPT.format(task=item.task_text, completion=item.completion)
    messages = [{"role": "user", "content": text}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return torch.tensor([ids["input_ids"]])


def test_judge_numbers_are_deterministic_and_what_the_model_answers_greedily(
    judge_url: str, tiny_judge_dir: Path
) -> None:
    first, figures = asyncio.run(judged(judge(judge_url, "number"), ITEMS))
    again, _ = asyncio.run(judged(judge(judge_url, "number"), ITEMS))
    assert first == again
    tokenizer = AutoTokenizer.from_pretrained(tiny_judge_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_judge_dir).eval()
    expected = []
    for item in ITEMS:
        ids = prompt_ids(tokenizer, item)
        output = model.generate(input_ids=ids, max_new_tokens=16, do_sample=False)
        answer = tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True)
        digit = re.search(r"\d", answer)
        expected.append(Judged(int(digit.group()) / 9) if digit else Judged.failed("unparseable"))
    assert first == expected
    assert all(result.value is not None for result in first)  # the judge answers "n4" and so on
    assert figures.requests == len(ITEMS) and figures.scored == len(ITEMS)
    assert figures.prompt_tokens > 0 and figures.completion_tokens >= len(ITEMS)


def test_judge_verdicts_are_the_verdict_probability_of_a_forward_pass(
    judge_url: str, tiny_judge_dir: Path
) -> None:
    first, figures = asyncio.run(judged(judge(judge_url, "verdict"), ITEMS))
    again, _ = asyncio.run(judged(judge(judge_url, "verdict"), ITEMS))
    assert [r.value for r in first] == pytest.approx([r.value for r in again], abs=1e-6)
    tokenizer = AutoTokenizer.from_pretrained(tiny_judge_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_judge_dir).eval()
    yes, no = tokenizer.convert_tokens_to_ids(["y", "n"])
    expected = []
    for item in ITEMS:
        with torch.no_grad():
            probabilities = torch.softmax(
                model(input_ids=prompt_ids(tokenizer, item)).logits[0, -1], -1
            )
        expected.append((probabilities[yes] / (probabilities[yes] + probabilities[no])).item())
    assert [r.value for r in first] == pytest.approx(expected, abs=1e-5)
    assert figures.completion_tokens == len(ITEMS)  # one token each: the verdict


def test_requests_in_flight_are_bounded_by_max_concurrent(judge_url: str) -> None:
    results, figures = asyncio.run(judged(judge(judge_url, "verdict", max_concurrent=2), ITEMS * 3))
    assert all(r.failure is None for r in results)
    assert figures.in_flight_max == 2
