"""Weights as files: version s is `broadcasts/step_s/` under the run (a Hugging Face checkpoint,
or a PEFT adapter for LoRA), which the orchestrator tells the servers to load (`broadcast.py`
has the layout and its guarantees). The servers need no receiver: the orchestrator's HTTP call
is the intake.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from asyncrl.config.trainer import TrainerConfig
from asyncrl.run.layout import broadcast_dir
from asyncrl.transport.broadcast import STABLE, publish_weights
from asyncrl.transport.weights.route import State, WeightRoute, WeightTransport


class FilesRoute(WeightRoute):
    """Weights out after each step, without holding up the next one.

    A directory of full weights is written by a thread of its own from a copy taken when the
    step ends (the next step changes the weights in place), so the trainer trains on while the
    files and their fingerprint are written: in the quick start's disaggregated layout that
    write was a tenth of every step. Writes stay in step order (each waits for the one before),
    and a write that failed raises at the next publish or at `close`. A LoRA adapter is small
    and written at once."""

    def __init__(self, config: TrainerConfig, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.keep = config.max_async_level + 2  # what `max_async_level` may still ask for
        self.keep_every = config.weights_interval  # every N-th step's weights stay
        self.writer: threading.Thread | None = None
        self.failure: BaseException | None = None

    def publish(self, step: int, model: torch.nn.Module, state: State) -> dict[str, float]:
        self.wait()
        if hasattr(model, "peft_config"):
            self.write(step, model, state)
            return {}
        snapshot = state if state is not None else weights_snapshot(model)
        self.writer = threading.Thread(
            target=self._write_in_background, args=(step, model, snapshot),
            name=f"asyncrl-publish-{step}",
        )  # fmt: skip
        self.writer.start()
        return {}

    def republish(self, version: int, model: torch.nn.Module, state: State) -> bool:
        """Only when the resumed step's broadcast is gone (pruned, or never made)."""
        if (broadcast_dir(self.run_dir, version) / STABLE).exists():
            return False
        self.wait()
        self.write(version, model, state)
        return True

    def write(self, step: int, model: torch.nn.Module, state: State) -> None:
        publish_weights(
            self.run_dir, step, model, keep=self.keep, state_dict=state,
            keep_every=self.keep_every,
        )  # fmt: skip

    def _write_in_background(self, step: int, model: torch.nn.Module, state: State) -> None:
        try:
            self.write(step, model, state)
        except BaseException as error:  # raised in the training thread, at the next call
            self.failure = error

    def wait(self) -> None:
        """Until the last write is on disk; its failure, if any, is raised here."""
        if self.writer is not None:
            self.writer.join()
            self.writer = None
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise RuntimeError(f"writing a weights broadcast failed: {failure}") from failure

    def close(self) -> None:
        self.wait()


def weights_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of what a process saves of the model: its parameters (a tied head once) and
    persistent buffers, detached from the tensors the next step updates."""
    own = {name for name, _ in model.named_parameters()}
    own |= {name for name, _ in model.named_buffers()}
    with torch.no_grad():
        return {
            name: tensor.detach().clone()
            for name, tensor in model.state_dict().items()
            if name in own
        }


TRANSPORT = WeightTransport("filesystem", route=FilesRoute)
