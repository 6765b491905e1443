"""Build a TrainingBatch from real completions of a live inference server."""

from __future__ import annotations

import httpx

from asyncrl.types import TrainingBatch, TrainingSample


def sample_batch(
    url: str,
    model: str,
    prompts: list[str],
    step: int,
    n: int = 2,
    max_tokens: int = 12,
    temperature: float = 0.7,
    seed: int = 0,
    advantages: list[float] | None = None,
) -> TrainingBatch:
    body = {
        "model": model, "prompt": prompts, "n": n, "max_tokens": max_tokens,
        "temperature": temperature, "seed": seed, "logprobs": 0, "return_token_ids": True,
        "ignore_eos": True,
    }  # fmt: skip
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    choices = response.json()["choices"]
    version = httpx.get(f"{url}/weight_info").json()["version"]
    samples = []
    for index, choice in enumerate(choices):
        tokens = choice["token_ids"]
        advantage = advantages[index] if advantages else (1.0 if index % 2 else -1.0)
        samples.append(
            TrainingSample(
                prompt_ids=choice["prompt_token_ids"],
                completion_ids=tokens,
                completion_mask=[True] * len(tokens),
                inference_logprobs=choice["logprobs"]["token_logprobs"],
                advantages=[advantage] * len(tokens),
                policy_versions=[version] * len(tokens),
                temperature=temperature,
                env="test",
            )
        )
    return TrainingBatch(step=step, samples=samples)
