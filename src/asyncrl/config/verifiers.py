"""How a verifiers environment (`env[].verifiers`) is run: its worker processes, their limits, the
renderer, and which of its tasks train and which are held out (docs/environments.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from asyncrl.config.base import StrictModel


class VerifiersConfig(StrictModel):
    workers: int = Field(
        1, ge=1, description="Worker processes running the environment's episodes."
    )
    episodes_per_worker: int = Field(
        8, ge=1, description="Episodes one worker plays at once (they wait on the model)."
    )
    episode_timeout: float = Field(
        600.0,
        gt=0,
        description="Seconds one episode may take, from its start to its reward; past it the "
        "episode is cancelled (its tool servers stopped) and scores 0, counted as `timeout`.",
    )
    hang_seconds: float = Field(
        30.0,
        gt=0,
        description="A worker silent this long (code that blocks its event loop: a synchronous "
        "reward or tool that hangs or loops) is killed with everything it started and replaced; "
        "its episodes in flight score 0, counted as `worker_hung`.",
    )
    memory_limit: float | None = Field(
        None,
        gt=0,
        description="GiB of address space for each worker and each process it starts (tool "
        "servers); null: no limit. A worker that exceeds it dies and is replaced.",
    )
    renderer: dict[str, Any] | None = Field(
        None,
        description="The `renderers` config the environment's train client renders turns with "
        "(`{name: qwen3}`, `{name: auto}`...); null: asyncrl's Hermes renderer over the model's "
        "own chat template (`envs/verifiers/renderer.py`), for models without tool tokens.",
    )
    allow_host_commands: bool = Field(
        False,
        description="Let the `bash` harness run: it runs the commands the model writes on this "
        "machine, in the worker's account.",
    )
    train_select: dict[str, Any] | None = Field(
        None,
        description="verifiers' task selection (`include`, `exclude`, `shuffle`, `seed`, "
        "`skip`, `limit`) for the tasks trained on; null with `eval_select` null: one task in "
        "eight (by its key's hash) is held out.",
    )
    eval_select: dict[str, Any] | None = Field(
        None, description="verifiers' task selection for the held-out tasks."
    )
    max_tasks: int = Field(
        10_000, ge=1, description="Tasks read from the taskset at most (an infinite one too)."
    )
