"""The server through real HTTP on 127.0.0.1: the official `openai` client and raw httpx."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model_name(tiny_model_dir: Path) -> str:
    return str(tiny_model_dir)


def test_models_and_health(server_url: str, client: openai.OpenAI, model_name: str) -> None:
    assert httpx.get(f"{server_url}/health").status_code == 200
    assert [m.id for m in client.models.list().data] == [model_name]


def test_completion_returns_token_ids_logprobs_and_usage(
    client: openai.OpenAI, model_name: str, tiny_model_dir: Path
) -> None:
    response = client.completions.create(
        model=model_name,
        prompt="hello",
        max_tokens=8,
        temperature=0.7,
        seed=1,
        logprobs=2,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = response.choices[0]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = choice.model_dump()
    assert data["prompt_token_ids"] == tokenizer("hello")["input_ids"]
    assert len(data["token_ids"]) == 8 and choice.finish_reason == "length"
    assert choice.text == tokenizer.decode(data["token_ids"], skip_special_tokens=True)
    assert len(choice.logprobs.token_logprobs) == 8
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    assert response.usage.prompt_tokens == 5 and response.usage.completion_tokens == 8


def test_chat_completion_applies_the_chat_template(
    server_url: str, model_name: str, tiny_model_dir: Path
) -> None:
    messages = [{"role": "user", "content": "abc"}]
    response = httpx.post(
        f"{server_url}/v1/chat/completions",
        json={
            "model": model_name, "messages": messages, "max_tokens": 5, "logprobs": True,
            "top_logprobs": 1, "return_token_ids": True, "ignore_eos": True,
        },
    ).json()  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert response["prompt_token_ids"] == expected
    choice = response["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["token_ids"]) == 5
    assert [c["token"] for c in choice["logprobs"]["content"]] == [
        tokenizer.decode([t]) for t in choice["token_ids"]
    ]


def test_n_samples_per_prompt_and_several_prompts(client: openai.OpenAI, model_name: str) -> None:
    response = client.completions.create(
        model=model_name, prompt=["ab", "cd"], n=3, max_tokens=6, temperature=1.0, seed=7
    )
    assert [c.index for c in response.choices] == [0, 1, 2, 3, 4, 5]
    assert len({c.text for c in response.choices[:3]}) > 1  # the 3 samples differ


def test_token_id_prompts_and_tokens_as_ids(server_url: str, model_name: str) -> None:
    response = httpx.post(
        f"{server_url}/v1/completions",
        json={
            "model": model_name, "prompt": [[70, 71], [72]], "max_tokens": 3, "logprobs": 0,
            "return_tokens_as_token_ids": True, "return_token_ids": True, "ignore_eos": True,
        },
    ).json()  # fmt: skip
    first = response["choices"][0]
    assert first["prompt_token_ids"] == [70, 71]
    assert first["logprobs"]["tokens"] == [f"token_id:{t}" for t in first["token_ids"]]
    assert response["choices"][1]["prompt_token_ids"] == [72]


def test_seeded_sampling_reproduces(client: openai.OpenAI, model_name: str) -> None:
    def draw(seed: int) -> list[str]:
        response = client.completions.create(
            model=model_name, prompt="xyz", n=4, max_tokens=10, temperature=1.0, seed=seed
        )
        return [c.text for c in response.choices]

    assert draw(11) == draw(11)
    assert draw(11) != draw(12)


def test_stop_strings_truncate_and_report_the_reason(server_url: str, model_name: str) -> None:
    # find what the model says greedily, then stop on a piece of it
    greedy = httpx.post(
        f"{server_url}/v1/completions",
        json={"model": model_name, "prompt": "abc", "max_tokens": 12, "temperature": 0,
              "ignore_eos": True},
    ).json()["choices"][0]["text"]  # fmt: skip
    stop = greedy[4:6]
    cut = httpx.post(
        f"{server_url}/v1/completions",
        json={"model": model_name, "prompt": "abc", "max_tokens": 12, "temperature": 0,
              "ignore_eos": True, "stop": [stop]},
    ).json()["choices"][0]  # fmt: skip
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["text"] == greedy[: greedy.find(stop)]


def test_min_tokens_holds_back_end_of_sequence(server_url: str, model_name: str) -> None:
    eos = AutoTokenizer.from_pretrained(model_name).eos_token_id
    response = httpx.post(
        f"{server_url}/v1/completions",
        json={"model": model_name, "prompt": "a", "max_tokens": 6, "min_tokens": 6,
              "return_token_ids": True, "temperature": 1.0, "seed": 0},
    ).json()["choices"][0]  # fmt: skip
    assert len(response["token_ids"]) == 6 and eos not in response["token_ids"]


def test_tokenize(server_url: str, model_name: str) -> None:
    response = httpx.post(f"{server_url}/tokenize", json={"prompt": "abc"}).json()
    assert response["count"] == 3 and response["max_model_len"] == 256


def test_logprobs_match_a_plain_forward_pass_at_the_same_temperature(
    server_url: str, model_name: str
) -> None:
    """The contract: logprob of each sampled token under log_softmax(logits / T), fp32."""
    temperature = 0.7
    body = {
        "model": model_name, "prompt": ["the cat", "q", "zz top"], "n": 2, "max_tokens": 12,
        "temperature": temperature, "seed": 5, "logprobs": 0, "return_token_ids": True,
        "ignore_eos": True,
    }  # fmt: skip
    response = httpx.post(f"{server_url}/v1/completions", json=body).json()
    model = AutoModelForCausalLM.from_pretrained(model_name, dtype=torch.float32)
    worst = 0.0
    for choice in response["choices"]:
        prompt, output = choice["prompt_token_ids"], choice["token_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + output])).logits[0].float()
        for position, token in enumerate(output):
            step = torch.log_softmax(logits[len(prompt) + position - 1] / temperature, dim=-1)
            served = choice["logprobs"]["token_logprobs"][position]
            worst = max(worst, abs(step[token].item() - served))
    assert worst <= 1e-5
