"""Held-out reward of the race's snapshots, every system's scored the same way.

One embedded server in float32 (whatever precision the runs trained in) loads each snapshot
in turn through `/update_weights` (a LoRA snapshot, asyncrl's or TRL's adapter directory,
through `/v1/load_lora_adapter` onto the start model) and answers the same held-out prompts:
sampled at the workload's temperature with a fixed seed per prompt, and greedy. Rewards are the
environment's own rubric.
Scoring is off the race's clock (after each run).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoTokenizer

from asyncrl.envs.base import Environment, Example, score
from asyncrl.launch.inference_process import inference_server

SEED = 1234  # the chunk from prompt i is sampled with seed SEED + i, for every snapshot
CHUNK = 64  # prompts per request


class SnapshotScorer:
    def __init__(
        self, url: str, env: Environment, tokenizer_dir: Path, prompts: int, max_tokens: int,
        temperature: float,
    ) -> None:  # fmt: skip
        self.url, self.env, self.max_tokens = url, env, max_tokens
        self.temperature = temperature
        self.examples: list[Example] = env.examples("eval", prompts)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.prompt_ids = [
            list(tokenizer.apply_chat_template(e.prompt, add_generation_prompt=True)["input_ids"])
            for e in self.examples
        ]

    def score(self, weights: Path | None) -> dict[str, float]:
        """Mean held-out reward sampled (at the workload's temperature) and greedy of `weights`
        (None: as loaded)."""
        return asyncio.run(self._score(weights))

    async def _score(self, weights: Path | None) -> dict[str, float]:
        async with httpx.AsyncClient(base_url=self.url, timeout=900) as client:
            if weights is not None and (weights / "adapter_config.json").exists():
                body = {"lora_name": "snapshot", "lora_path": str(weights), "load_inplace": True}
                response = await client.post("/v1/load_lora_adapter", json=body)
                response.raise_for_status()  # merged onto the base the server started with
            elif weights is not None:
                response = await client.post("/update_weights", json={"weight_dir": str(weights)})
                response.raise_for_status()
            return {
                "sampled": await self._mean_reward(client, temperature=self.temperature),
                "greedy": await self._mean_reward(client, temperature=0.0),
            }

    async def _mean_reward(self, client: httpx.AsyncClient, temperature: float) -> float:
        """All prompts, CHUNK per request (each request its own seed, the same for every
        snapshot): the engine then holds hundreds of sequences at once."""

        async def chunk(first: int) -> list[float]:
            body: dict[str, Any] = {
                "prompt": self.prompt_ids[first : first + CHUNK],
                "max_tokens": self.max_tokens, "temperature": temperature, "seed": SEED + first,
            }  # fmt: skip
            response = await client.post("/v1/completions", json=body)
            response.raise_for_status()
            choices = sorted(response.json()["choices"], key=lambda choice: choice["index"])
            return [
                float(score(self.env, choice["text"], self.examples[first + number]))
                for number, choice in enumerate(choices)
            ]

        chunks = await asyncio.gather(*(chunk(i) for i in range(0, len(self.examples), CHUNK)))
        return statistics.fmean(reward for rewards in chunks for reward in rewards)


@contextmanager
def snapshot_scorer(
    base_model: Path, weight_root: Path, env: Environment, prompts: int, max_tokens: int,
    log: Path, temperature: float = 1.0,
) -> Iterator[SnapshotScorer]:  # fmt: skip
    """A float32 server on the SFT model that may load any snapshot under `weight_root`."""
    args = ["--dtype", "float32", "--max_num_seqs", "256", "--max_model_len", "1024",
            "--weight_roots", f"[{weight_root}]"]  # fmt: skip
    with inference_server(base_model, *args, log_path=log, startup_timeout=300) as url:
        yield SnapshotScorer(url, env, base_model, prompts, max_tokens, temperature)
