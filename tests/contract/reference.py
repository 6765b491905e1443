"""Independent references the engines are held to: the trainer's own logprob function and a
plain greedy loop over a transformers forward pass."""

from __future__ import annotations

from typing import Any

import httpx
import torch

from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.packing import Sample, collate_rows


def trainer_logprobs(
    model: torch.nn.Module, prompt: list[int], output: list[int], temperature: float
) -> list[float]:
    """What the trainer computes for these tokens (one sample, one packed row)."""
    sample = Sample([*prompt, *output], [False] * len(prompt) + [True] * len(output))
    batch = collate_rows([[0]], [sample], len(sample.input_ids), pad_token_id=0)
    with torch.no_grad():
        return completion_logprobs(model, batch, temperature).logprobs.tolist()


def worst_logprob_gap(
    choices: list[dict[str, Any]], prompt_of: Any, model: torch.nn.Module, temperature: float
) -> float:
    """Largest |served − trainer| logprob over every sampled token of `choices`."""
    worst = 0.0
    for choice in choices:
        served = served_logprobs(choice)
        expected = trainer_logprobs(model, prompt_of(choice), choice["token_ids"], temperature)
        assert len(served) == len(expected) == len(choice["token_ids"])
        worst = max([worst, *(abs(a - b) for a, b in zip(served, expected, strict=True))])
    return worst


def served_logprobs(choice: dict[str, Any]) -> list[float]:
    if "message" in choice:
        return [entry["logprob"] for entry in choice["logprobs"]["content"]]
    return list(choice["logprobs"]["token_logprobs"])


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """Argmax decoding with a full forward pass per token: slow, obviously right."""
    ids = list(prompt)
    for _ in range(max_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result
