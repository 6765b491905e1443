"""Weights in memory to an engine in the trainer's own process (`deployment: colocated`): the
engine generates while the trainer waits for a batch, sleeps for the step, and wakes holding
the step's weights, taken straight from the trainer's parameters.

The engine is built outside the trainer (`asyncrl.colocation.engine_host`, the receiving end:
it shares or copies the tensors, LoRA merged) and handed in as a `HostEngine`, so the trainer
never imports the inference role. Files are still written at checkpoint and weights-interval
steps and at the last step, for evaluation and export.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from asyncrl.config.inference import InferenceConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger
from asyncrl.run.layout import finished_marker
from asyncrl.transport.broadcast import publish_weights
from asyncrl.transport.run_end import run_finished
from asyncrl.transport.weights.route import State, WeightRoute
from asyncrl.waiting import Wait

logger = get_logger(__name__)


class ColocatedEngine(Protocol):
    def busy_seconds(self) -> float:
        """Seconds the engine has spent generating since it started."""
        ...

    def sleep(self) -> dict[str, float]:
        """Before a step: stop generating and give the device back; returns metrics."""
        ...

    def wake(self, step: int, model: torch.nn.Module) -> dict[str, float]:
        """After step `step`: take weights version `step` from `model` and resume; metrics."""
        ...

    def check(self) -> None:
        """Raise if the engine gave up (its steps kept failing): no batch would ever come."""
        ...

    def close(self) -> None: ...


# (serving config, the policy, the weights version it holds) -> a started engine
HostEngine = Callable[[InferenceConfig, torch.nn.Module, int], ColocatedEngine]


class ColocatedRoute(WeightRoute):
    def __init__(self, config: TrainerConfig, run_dir: Path, host_engine: HostEngine) -> None:
        assert config.colocated_inference is not None  # the route of a colocated trainer
        self.serving, self.host_engine = config.colocated_inference, host_engine
        self.run_dir = run_dir
        self.keep, self.keep_every = config.max_async_level + 2, config.weights_interval
        self.file_intervals = (config.save_steps, config.weights_interval)
        self.last_step = config.max_steps
        self.finish_timeout = config.finish_timeout
        self.engine: ColocatedEngine | None = None
        if config.max_async_level > 0:
            logger.warning(
                "colocated: max_async_level %d lets rollouts span a weight update, but the engine "
                "sleeps while a step trains, so nothing overlaps: it only adds off-policy tokens "
                "(0 was faster on a CPU, see benchmarks/RESULTS.md)", config.max_async_level,
            )  # fmt: skip

    def start(self, version: int, model: torch.nn.Module) -> None:
        """The engine starts from the trainer's weights (so a resume republishes nothing)."""
        self.engine = self.host_engine(self.serving, model, version)

    def waiting(self) -> None:
        self._engine().check()

    def generation_seconds(self) -> float:
        return self._engine().busy_seconds()

    def before_step(self) -> dict[str, float]:
        return self._engine().sleep()

    def publish(self, step: int, model: torch.nn.Module, state: State) -> dict[str, float]:
        """The engine wakes with the step's weights; then, at checkpoint and weights-interval
        steps and the last one, the files too (generation goes on meanwhile)."""
        metrics = self._engine().wake(step, model)
        if step == self.last_step or any(
            interval and step % interval == 0 for interval in self.file_intervals
        ):
            publish_weights(
                self.run_dir, step, model, keep=self.keep, state_dict=state, pushed=True,
                keep_every=self.keep_every,
            )  # fmt: skip
        return metrics

    def finish(self) -> None:
        """The server outlives training: the orchestrator still loads the final weights and
        may evaluate them. It is done when it marks the run finished."""
        logger.info("trainer: training done; serving until the orchestrator finishes")
        wait = Wait(
            f"the orchestrator to finish the run (to write {finished_marker(self.run_dir)})",
            logger, self.finish_timeout, first_report_after=30.0, key="trainer.finish_timeout",
        )  # fmt: skip
        while not run_finished(self.run_dir):
            wait.check()
            time.sleep(0.2)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def _engine(self) -> ColocatedEngine:
        assert self.engine is not None, "start() starts the engine"
        return self.engine
