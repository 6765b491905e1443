"""The two ends of a weight transport, as the trainer and a server see them.

The trainer calls its `WeightRoute` at fixed points of its loop and never asks which route it
holds: `start` once its weights are loaded (or resumed), `republish` when it resumed, `waiting`
while it waits for a batch, `before_step` / `publish` around every optimizer step, `finish` after
the last one. Only rank 0 holds a route; every rank has already taken part in gathering the
weights (`state`: the whole model on rank 0 under FSDP, None on one process, where the model's
own tensors are the weights).

A server holds a `WeightIntake` when weights are pushed to it: it runs beside the engine and
installs each version through `WeightTarget.apply_received`. A route that leaves files for the
orchestrator to load needs none.

After a version is out, a route leaves its record in the run's broadcasts (the files
themselves, or a marker with `pushed` set when the servers received the weights another way):
that is how the orchestrator learns which version exists, whatever carried it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from asyncrl.config.inference import InferenceConfig
    from asyncrl.config.trainer import TrainerConfig
    from asyncrl.transport.weights.manifest import Manifest

State = dict[str, torch.Tensor] | None  # gathered weights (rank 0 under FSDP), or None: the model's


class WeightRoute:
    """The trainer's end. Every method has a do-nothing default, so a route overrides only the
    points of the loop where it has work."""

    # how often (seconds) `waiting` wants to run while the trainer waits for a batch; None: at
    # the trainer's own pace (its heartbeat to the other ranks)
    poll_seconds: float | None = None

    def start(self, version: int, model: torch.nn.Module) -> None:
        """The weights are loaded, at version `version` (0, or the step resumed from)."""

    def republish(self, version: int, model: torch.nn.Module, state: State) -> bool:
        """A resumed trainer's weights, for servers that may hold a future it withdrew; True
        when they went out (by default nothing goes)."""
        return False

    def waiting(self) -> None:
        """Between slices of the wait for a batch: admit a returning server; raise when what
        the batch depends on has failed, so the trainer stops at once."""

    def generation_seconds(self) -> float | None:
        """Seconds spent generating in this process so far (a colocated engine); None when
        nothing generates here."""
        return None

    def before_step(self) -> dict[str, float]:
        """Just before an optimizer step; returns metrics."""
        return {}

    def publish(self, step: int, model: torch.nn.Module, state: State) -> dict[str, float]:
        """Weights version `step` out; returns metrics."""
        raise NotImplementedError

    def finish(self) -> None:
        """After the last step (the run goes on without training: evaluation, a last load)."""

    def close(self) -> None:
        """Release what the route holds; a write still in flight finishes first."""


class WeightTarget(Protocol):
    """What a server gives its intake: the model whose parameters name and shape what arrives,
    and the call that installs a version between engine steps."""

    @property
    def model(self) -> torch.nn.Module: ...

    def apply_received(
        self,
        step: int,
        tensors: dict[str, torch.Tensor],
        source: str = ...,
        manifest: Manifest | None = ...,
    ) -> object:
        """Install version `step`; with the sender's `manifest`, checked against it first
        (`WeightsMismatch` naming the tensors, nothing installed)."""
        ...

    def apply_delta(
        self, step: int, blobs: dict[str, bytes], manifest: Manifest, source: str = ...
    ) -> object:
        """Install version `step` from a delta on the version held (`manifest` names its base):
        `DeltaRefused` when the server does not hold that base."""
        ...

    def reloaded(self, why: str) -> None:
        """Count a version asked for again because what arrived did not check."""
        ...

    def give_up(self, reason: str) -> None:
        """Stop serving for good (the server's process exits for its supervisor to restart)."""
        ...


class WeightIntake(Protocol):
    """The server's end of a pushing transport, running beside the engine."""

    # set when the intake stopped on an error: `/health` reports it, the server serves on
    error: BaseException | None

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class WeightTransport:
    """A transport's two ends, as the config names them (`weight_broadcast.type`)."""

    name: str
    route: Callable[[TrainerConfig, Path], WeightRoute]
    # None: the servers receive nothing themselves (the orchestrator loads files into them)
    intake: Callable[[WeightTarget, InferenceConfig], WeightIntake] | None = None
