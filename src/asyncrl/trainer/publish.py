"""Weights out to inference after a step: over NCCL/gloo to the servers, or as a broadcast
directory they load. With several ranks every rank helps gather the weights; rank 0 sends.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger
from asyncrl.trainer.parallel import SINGLE_PROCESS, Ranks, full_state_dict
from asyncrl.trainer.quantized_base import dequantized_base
from asyncrl.transport.broadcast import publish_marker, publish_weights
from asyncrl.transport.fingerprint import weights_fingerprint
from asyncrl.transport.nccl_broadcast import WeightSender
from asyncrl.transport.served_base import write_served_base

logger = get_logger(__name__)


def open_sender(config: TrainerConfig) -> WeightSender | None:
    broadcast = config.weight_broadcast
    if broadcast.type != "nccl":
        return None
    return WeightSender(
        broadcast.host, broadcast.port, broadcast.inference_world_size, broadcast.timeout
    )


def publish(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    sender: WeightSender | None,
    keep: int,
    ranks: Ranks,
    gathered: dict[str, torch.Tensor] | None = None,
    keep_every: int | None = None,
) -> None:
    """Weights version `step` out to inference at once: over NCCL/gloo, or as a broadcast
    directory. With several ranks every rank takes part in gathering the weights (unless
    `gathered` already holds them); rank 0 publishes."""
    if gathered is None:
        gathered = full_state_dict(model, ranks)
    if not ranks.is_main:
        return
    if sender is None:
        publish_weights(run_dir, step, model, keep=keep, state_dict=gathered, keep_every=keep_every)
        return
    sender.send(step, model)
    fingerprint = weights_fingerprint(model.named_parameters())
    publish_marker(run_dir, step, fingerprint, keep=keep, keep_every=keep_every)


class WeightPublisher:
    """Weights out after each step, without holding up the next one.

    Over NCCL/gloo they are sent at once: the servers take them from the wire. A broadcast
    directory of full weights is written by a thread of its own from a copy taken when the
    step ends (the next step changes the weights in place), so the trainer trains on while the
    files and their fingerprint are written: in the quick start's disaggregated layout that
    write was a tenth of every step. Writes stay in step order (each waits for the one
    before), and a write that failed raises at the next publish or at `close`. A LoRA adapter
    is small and written at once."""

    def __init__(
        self,
        run_dir: Path,
        sender: WeightSender | None,
        keep: int,
        ranks: Ranks,
        keep_every: int | None = None,
    ) -> None:
        self.run_dir, self.sender, self.keep, self.ranks = run_dir, sender, keep, ranks
        self.keep_every = keep_every  # every N-th step's weights stay
        self.writer: threading.Thread | None = None
        self.failure: BaseException | None = None

    def publish(self, step: int, model: torch.nn.Module) -> None:
        gathered = full_state_dict(model, self.ranks)  # every rank takes part
        if not self.ranks.is_main:
            return
        self.wait()
        if self.sender is not None or hasattr(model, "peft_config"):
            publish(
                self.run_dir, step, model, self.sender, self.keep, SINGLE_PROCESS, gathered,
                self.keep_every,
            )  # fmt: skip
            return
        snapshot = gathered if gathered is not None else weights_snapshot(model)
        self.writer = threading.Thread(
            target=self._write, args=(step, model, snapshot), name=f"asyncrl-publish-{step}"
        )
        self.writer.start()

    def _write(self, step: int, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        try:
            publish_weights(
                self.run_dir, step, model, keep=self.keep, state_dict=state,
                keep_every=self.keep_every,
            )  # fmt: skip
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


def publish_served_base(
    config: TrainerConfig, run_dir: Path, model: torch.nn.Module, ranks: Ranks
) -> None:
    """With `qlora_served_base: dequantized`: the quantized base, dequantized, for the servers
    to apply adapters to (once; kept when a restarted trainer finds the same weights there).
    Every rank takes part: under FSDP each weight is gathered in turn; rank 0 writes."""
    if config.qlora_served_base != "dequantized" or config.colocated_inference is not None:
        return  # a colocated engine takes the dequantized base in memory
    tensors = dequantized_base(model, keep=ranks.is_main)
    if not ranks.is_main:
        return
    base = write_served_base(run_dir, tensors, source=config.model)
    logger.info("trainer: the dequantized base is served from %s (fingerprint %s)",
                base.path, base.fingerprint)  # fmt: skip
