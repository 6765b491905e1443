"""Weights over torch.distributed (NCCL on GPUs, gloo on CPU): the trainer sends every
parameter to the servers' ranks (`nccl_broadcast.py` has the group, its rebuilds and its
authentication), then leaves a marker in the run's broadcasts so the orchestrator knows the
version is out. Each server receives on a thread of its own and installs what arrives between
engine steps; it joins the trainer's group by itself, and again whenever the trainer restarts
or re-forms the group. Each version is checked by the servers against the trainer's manifest
before they install it, and may go as a delta from the one before (`nccl_broadcast.py`). Full
weights only: LoRA goes as files.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from asyncrl.config.inference import InferenceConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger
from asyncrl.transport.broadcast import publish_marker
from asyncrl.transport.nccl_broadcast import WeightReceiver, WeightSender
from asyncrl.transport.weights.delta import DeltaError, DeltaPolicy, DeltaRefused
from asyncrl.transport.weights.manifest import WeightsMismatch
from asyncrl.transport.weights.route import State, WeightRoute, WeightTarget, WeightTransport
from asyncrl.transport.weights.served_dtype import served_dtype

logger = get_logger(__name__)

ADMIT_EVERY = 1.0  # seconds between looks for a restarted server while a batch is awaited


class NcclRoute(WeightRoute):
    """The trainer as rank 0 of the weight group. While it waits for a batch it lets a
    restarted server back in: the batch awaited may be one only that server can generate."""

    poll_seconds = ADMIT_EVERY

    def __init__(self, config: TrainerConfig, run_dir: Path) -> None:
        self.config, self.settings = config, config.weight_broadcast
        self.run_dir = run_dir
        self.keep, self.keep_every = config.max_async_level + 2, config.weights_interval
        self.sender: WeightSender | None = None

    def start(self, version: int, model: torch.nn.Module) -> None:
        """Form the group: waits (at most `timeout`) for every server to join. Weights go at
        the servers' dtype; as deltas when `weight_broadcast.delta` says they pay (`auto`:
        never on a GPU, where a delta is encoded on the CPU and NCCL's bandwidth is far above
        what that saves)."""
        settings = self.settings
        served = served_dtype(self.config)
        trainer_dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        mode = settings.delta
        if mode == "auto" and next(model.parameters()).device.type != "cpu":
            mode = "off"
        self.sender = WeightSender(
            settings.host, settings.port, settings.inference_world_size, settings.timeout,
            served_dtype=served, delta=DeltaPolicy(mode, trainer_dtype, served),
        )  # fmt: skip

    def republish(self, version: int, model: torch.nn.Module, state: State) -> bool:
        """Always: the servers in the new group hold whatever the dead trainer last sent."""
        self.publish(version, model, state)
        return True

    def waiting(self) -> None:
        if self.sender is not None:
            self.sender.admit_restarted_servers()

    def publish(self, step: int, model: torch.nn.Module, state: State) -> dict[str, float]:
        assert self.sender is not None, "start() forms the group"
        manifest = self.sender.send(step, model)
        publish_marker(
            self.run_dir, step, manifest.fingerprint, keep=self.keep, keep_every=self.keep_every
        )
        return dict(self.sender.sizes)

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()


class NcclIntake(threading.Thread):
    """A server's rank in the trainer's group: receives each version, checks it against the
    trainer's manifest and installs it. A version that does not check (a torn transfer) is
    asked for again once (the trainer sends its current weights to a group formed anew); a
    second in a row makes the server give up, naming the tensors, for its supervisor to
    restart it — it never serves them."""

    def __init__(self, target: WeightTarget, config: InferenceConfig) -> None:
        super().__init__(name="asyncrl-weight-receiver", daemon=True)
        self.target, self.config = target, config
        self._stop_event = threading.Event()
        self.error: BaseException | None = None
        self.mismatches = 0  # in a row

    def run(self) -> None:
        config = self.config
        receiver = WeightReceiver(
            config.weight_broadcast_host,
            config.weight_broadcast_port,
            config.weight_broadcast_rank,
            config.weight_broadcast_world_size,
            config.weight_broadcast_timeout,
        )
        try:
            while not self._stop_event.is_set():
                received = receiver.receive(self.target.model, self._stop_event.is_set)
                if received is None:
                    break
                step, manifest = received.step, received.manifest
                try:
                    if received.blobs is not None:
                        assert manifest is not None  # a delta names its base
                        self.target.apply_delta(step, received.blobs, manifest, "nccl")
                    else:
                        assert received.tensors is not None
                        self.target.apply_received(step, received.tensors, "nccl", manifest)
                except DeltaRefused as refused:  # not its base: the trainer sends it all
                    receiver.ask_again(str(refused))
                    continue
                except (WeightsMismatch, DeltaError) as mismatch:
                    self.mismatches += 1
                    self.target.reloaded(f"{mismatch}: asking the trainer to send it again")
                    if self.mismatches > 1:
                        self.target.give_up(f"weights received twice do not check: {mismatch}")
                        raise
                    receiver.ask_again(f"weights version {step} did not check")
                    continue
                self.mismatches = 0
        except Exception as error:  # reported on /health; the server keeps serving old weights
            self.error = error
            logger.exception("weight receiver stopped: %s", error)
        finally:
            receiver.close()

    def stop(self) -> None:
        self._stop_event.set()


TRANSPORT = WeightTransport("nccl", route=NcclRoute, intake=NcclIntake)
