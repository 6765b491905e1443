"""Generation: the same shapes, token ids and logprobs from every engine."""

from __future__ import annotations

import httpx
import pytest
import torch
from tests.contract.conftest import Engine
from tests.contract.reference import complete, greedy, served_logprobs, worst_logprob_gap
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = [pytest.mark.integration, pytest.mark.contract]

PROMPTS = ["the cat", "q", "zz top"]


def load(engine: Engine) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(engine.model_dir, dtype=torch.float32).eval()


def test_models_lists_the_served_model(engine: Engine) -> None:
    models = httpx.get(f"{engine.url}/v1/models").json()
    assert engine.model in [entry["id"] for entry in models["data"]]
    assert httpx.get(f"{engine.url}/health").status_code == 200


def test_completion_response_shape(engine: Engine) -> None:
    tokenizer = AutoTokenizer.from_pretrained(engine.model_dir)
    response = complete(engine.url, {
        "model": engine.model, "prompt": "hello", "max_tokens": 8, "temperature": 1.0,
        "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
    })  # fmt: skip
    assert response["object"] == "text_completion"
    (choice,) = response["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["prompt_token_ids"] == tokenizer("hello")["input_ids"]
    assert len(choice["token_ids"]) == 8 and len(served_logprobs(choice)) == 8
    assert all(value <= 0.0 for value in served_logprobs(choice))
    assert choice["text"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert response["usage"]["prompt_tokens"] == 5
    assert response["usage"]["completion_tokens"] == 8


def test_chat_prompt_is_the_chat_template_and_logprobs_follow_the_tokens(engine: Engine) -> None:
    tokenizer = AutoTokenizer.from_pretrained(engine.model_dir)
    messages = [{"role": "user", "content": "reverse: abc"}]
    response = httpx.post(f"{engine.url}/v1/chat/completions", timeout=60, json={
        "model": engine.model, "messages": messages, "max_tokens": 6, "logprobs": True,
        "return_token_ids": True, "ignore_eos": True, "n": 2, "temperature": 1.0,
    }).json()  # fmt: skip
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert response["prompt_token_ids"] == expected
    assert [choice["index"] for choice in response["choices"]] == [0, 1]
    for choice in response["choices"]:
        assert choice["message"]["role"] == "assistant"
        assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == 6


def test_logprobs_match_the_trainers_logprob_function(engine: Engine) -> None:
    """The contract the importance ratios rest on: processed logprobs (after temperature),
    equal to the trainer's to 1e-5 in float32."""
    temperature = 0.7
    response = complete(engine.url, {
        "model": engine.model, "prompt": PROMPTS, "n": 2, "max_tokens": 12, "seed": 5,
        "temperature": temperature, "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
    })  # fmt: skip
    assert len(response["choices"]) == 6
    gap = worst_logprob_gap(
        response["choices"], lambda c: c["prompt_token_ids"], load(engine), temperature
    )
    assert gap <= 1e-5


def test_greedy_is_deterministic_and_is_argmax_decoding(engine: Engine) -> None:
    body = {
        "model": engine.model, "prompt": PROMPTS, "max_tokens": 10, "temperature": 0.0,
        "return_token_ids": True, "ignore_eos": True,
    }  # fmt: skip
    first, second = complete(engine.url, body), complete(engine.url, body)
    assert [c["token_ids"] for c in first["choices"]] == [c["token_ids"] for c in second["choices"]]
    model = load(engine)
    for choice in first["choices"]:
        assert choice["token_ids"] == greedy(model, choice["prompt_token_ids"], 10)


def test_n_samples_differ_and_are_indexed_per_prompt(engine: Engine) -> None:
    response = complete(engine.url, {
        "model": engine.model, "prompt": ["ab", "cd"], "n": 4, "max_tokens": 8,
        "temperature": 1.0, "return_token_ids": True, "ignore_eos": True,
    })  # fmt: skip
    assert [c["index"] for c in response["choices"]] == list(range(8))
    first_prompt = [tuple(c["token_ids"]) for c in response["choices"][:4]]
    assert len(set(first_prompt)) > 1


def test_stop_strings_cut_the_text_and_name_the_stop(engine: Engine) -> None:
    body = {
        "model": engine.model, "prompt": "abc", "max_tokens": 12, "temperature": 0.0,
        "ignore_eos": True,
    }  # fmt: skip
    text = complete(engine.url, body)["choices"][0]["text"]
    stop = text[4:6]
    cut = complete(engine.url, {**body, "stop": [stop]})["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["text"] == text[: text.find(stop)]


def test_a_kept_stop_string_ends_the_text_and_its_tokens_are_returned(engine: Engine) -> None:
    """vLLM's `include_stop_str_in_output`: what an answer's closing tag needs to be scored."""
    body = {
        "model": engine.model, "prompt": "abc", "max_tokens": 12, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True,
    }  # fmt: skip
    text = complete(engine.url, body)["choices"][0]["text"]
    stop = text[4:6]
    kept = complete(engine.url, {**body, "stop": [stop], "include_stop_str_in_output": True})
    choice = kept["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["text"] == text[: text.find(stop) + len(stop)]
    decoded = AutoTokenizer.from_pretrained(engine.model_dir).decode(choice["token_ids"])
    assert decoded.startswith(choice["text"])  # the tokens that wrote the stop are all there
