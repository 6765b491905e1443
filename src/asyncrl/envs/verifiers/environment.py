"""A verifiers environment as the orchestrator sees it: its name, tasks and reward functions.

It never imports verifiers. At start-up one worker process describes the environment
(`worker.py describe`): it loads it as verifiers does, applies asyncrl's defaults and refusals
(`setup.py`), and lists its tasks by split and its reward functions with their weights. A
refusal, or a taskset that fails to load, stops the run there as a config error with the
reason. The examples handed to the buffer stand for tasks: `info["vf_key"]` names the task in
the worker's taskset, `prompt` is for display (samples, logs), `task` is the taskset id.

verifiers has no train/eval split of its own (its consumers select tasks): asyncrl holds out
one task in eight by the hash of its key, unless `verifiers.train_select` / `eval_select`
choose (verifiers' `SelectConfig`); a taskset too small for one held-out task trains on all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cached_property
from typing import Any

import msgspec

from asyncrl.config.base import ConfigError
from asyncrl.config.env import EnvConfig
from asyncrl.config.verifiers import VerifiersConfig
from asyncrl.envs.base import Example, RewardFunction, Split
from asyncrl.envs.verifiers import record
from asyncrl.log import get_logger
from asyncrl.user_code import start_user_code, user_code_environment

logger = get_logger(__name__)

DESCRIBE_TIMEOUT_S = 900.0  # importing verifiers and loading a taskset, on a busy machine


def run_elsewhere(completion: Any, example: Example) -> float:
    raise RuntimeError("a verifiers environment scores its episodes in its own workers")


def worker_spec(env: EnvConfig, model: str) -> dict[str, Any]:
    """What a worker needs to load the environment (the pool adds how to reach the gate)."""
    settings = env.verifiers or VerifiersConfig()
    return {
        "id": env.id,
        "args": env.args,
        "model": model,
        "allow_host_commands": settings.allow_host_commands,
        "renderer": settings.renderer,
        "train_select": settings.train_select,
        "eval_select": settings.eval_select,
        "max_tasks": settings.max_tasks,
        "memory_limit": settings.memory_limit,
    }


class VerifiersEnvironment:
    def __init__(self, spec: EnvConfig, model: str) -> None:
        if spec.model_rewards:
            raise ConfigError(
                f"env `{spec.name or spec.id}`: `model_rewards` are not added to a verifiers "
                "environment's rewards; give its task a judge (docs/environments.md)"
            )
        self.spec = spec
        self.name = spec.name or spec.id
        self.model = model
        self.settings = spec.verifiers or VerifiersConfig()

    @cached_property
    def described(self) -> record.Described:
        """The worker's description of the environment (run once, at start-up)."""
        command = [
            sys.executable,
            "-m",
            "asyncrl.envs.verifiers.worker",
            "describe",
            json.dumps(worker_spec(self.spec, self.model)),
        ]
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=user_code_environment(),
                preexec_fn=start_user_code,
                timeout=DESCRIBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(
                f"env `{self.name}`: the verifiers environment did not load in "
                f"{DESCRIBE_TIMEOUT_S:.0f} s"
            ) from None
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        try:
            answer = msgspec.json.decode(lines[-1], type=record.Described | record.Refused)
        except (IndexError, msgspec.DecodeError):
            tail = done.stderr.decode(errors="replace")[-3000:]
            raise ConfigError(
                f"env `{self.name}`: the verifiers worker gave no description "
                f"(exit {done.returncode}):\n{tail}"
            ) from None
        if isinstance(answer, record.Refused):
            raise ConfigError(f"env `{self.name}` cannot run here: {answer.reason}")
        for note in answer.notes:
            logger.info("env `%s`: %s", self.name, note)
        return answer

    @property
    def rubric(self) -> list[RewardFunction]:
        return [
            RewardFunction(name, run_elsewhere, weight)
            for name, weight in self.described.rewards.items()
        ]

    def examples(self, split: Split, count: int) -> list[Example]:
        tasks = (self.described.train if split == "train" else self.described.eval)[:count]
        seen: set[str] = set()
        examples = []
        for index, task in enumerate(tasks):
            shown = task.prompt[-1]["content"] if task.prompt else task.name
            if shown in seen:  # the buffer tells examples apart by their prompts
                shown = (
                    f"{shown} [{task.name}]"
                    if f"{shown} [{task.name}]" not in seen
                    else (f"{shown} [{task.key[:16]}]")
                )
            seen.add(shown)
            examples.append(
                Example(
                    example_id=index,
                    prompt=[{"role": "user", "content": shown}],
                    answer="",
                    task=self.spec.id,
                    info={"vf_key": task.key, "vf_name": task.name},
                    source=f"verifiers taskset {self.spec.id}, task {task.name}",
                )
            )
        return examples
