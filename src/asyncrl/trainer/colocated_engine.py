"""What the trainer loop needs from an inference engine that shares its device
(`deployment: colocated`): generate while the trainer waits for a batch, sleep for the step,
wake holding the step's weights.

The engine itself is built outside the trainer (`asyncrl.colocation.engine_host`) and handed
in, so the trainer never imports the inference role.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from asyncrl.config.inference import InferenceConfig
from asyncrl.log import get_logger
from asyncrl.transport.run_end import run_finished
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


def serve_until_finished(run_dir: Path) -> None:
    """A colocated trainer's server outlives training: the orchestrator still loads the final
    weights and may evaluate them. It is done when it marks the run finished."""
    logger.info("trainer: training done; serving until the orchestrator finishes")
    wait = Wait("the orchestrator to finish the run", logger, first_report_after=30.0)
    while not run_finished(run_dir):
        wait.check()
        time.sleep(0.2)
