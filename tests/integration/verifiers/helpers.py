"""Playing groups of a verifiers environment's episodes with the orchestrator's own pieces: its
client pool on a real engine, the token gate, the environment's pool of worker processes and
the group path (`orchestrator/verifiers_group.py`), as `asyncrl rl` does, without a trainer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config.env import EnvConfig
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs.base import Example
from asyncrl.envs.verifiers.environment import VerifiersEnvironment
from asyncrl.envs.verifiers.pool import VerifiersPool
from asyncrl.orchestrator.buffer import Drawn
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.group import Group, GroupRequest
from asyncrl.orchestrator.token_gate import TokenGate
from asyncrl.orchestrator.verifiers_group import run_verifiers_group


def orchestrator_config(
    model: Path, server: str, env: dict[str, Any], rollouts: int = 2, **overrides: Any
) -> OrchestratorConfig:
    fields: dict[str, Any] = {
        "model": {"name": str(model)}, "env": [env], "batch_size": rollouts,
        "rollouts_per_example": rollouts, "seq_len": 1024,
        "sampling": {"max_tokens": 48, "temperature": 0.7},
        "client": {"base_url": [f"{server}/v1"]},
    }  # fmt: skip
    return OrchestratorConfig(**(fields | overrides))


@dataclass
class Played:
    groups: list[Group]
    pool: VerifiersPool
    gate: TokenGate
    examples: list[Example]
    metrics: dict[str, float]


def play(
    model: Path,
    server: str,
    env: dict[str, Any],
    groups: int = 1,
    rollouts: int = 2,
    seed: int | None = 11,
    rounds: list[list[str]] | None = None,
    **overrides: Any,
) -> Played:
    """`groups` groups (one per train task, in order, round robin) of `rollouts` episodes, one
    after the other; or with `rounds`, one group of each task named (by its name), the groups
    of a round all at once (as the orchestrator plays groups: a slow episode holds up no other),
    the rounds one after the other. The groups come back in the order named."""
    config = orchestrator_config(model, server, env, rollouts, **overrides)
    environment = VerifiersEnvironment(EnvConfig(**env), str(model))
    examples = environment.examples("train", 100)
    if rounds is None:
        rounds = [[examples[i % len(examples)].info["vf_name"]] for i in range(groups)]
    by_name = {example.info["vf_name"]: example for example in examples}

    async def scenario() -> Played:
        clients = ClientPool(config.client)
        await clients.start(str(model))
        gate = TokenGate(clients, config, lambda: str(model))
        pool = VerifiersPool(environment, gate, served_name=str(model))
        await pool.start()

        def group(name: str) -> Any:
            temperature = config.sampling.temperature
            request = GroupRequest(Drawn(0, by_name[name]), environment.name, str(model),
                                   temperature, seed, launch_version=0)  # fmt: skip
            return run_verifiers_group(request, config, pool, vocab_size=49152)

        try:
            played = []
            for names in rounds:
                played += await asyncio.gather(*(group(name) for name in names))
            return Played(played, pool, gate, examples, pool.metrics() | gate.metrics())
        finally:
            await pool.close()
            await clients.close()

    return asyncio.run(scenario())
