"""How batches travel from the orchestrator to the trainer: one interface, two transports.

- filesystem: `rollouts/step_N/batch.msgpack` written atomically; `rollouts/DONE` at the end.
  Survives restarts; the default.
- zmq: PUSH (orchestrator, binds) → PULL (trainer, connects) with a high-water mark, carrying
  the same msgpack-encoded structs; an empty batch with step 0 means "no more batches". With the
  run's secret the two ends speak CURVE and no other peer can connect (`zmq_auth.py`); without
  it the socket must be on loopback.

Both decode with msgspec's typed decoder: nothing is unpickled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from asyncrl.config.transport import RolloutTransportConfig
from asyncrl.log import get_logger
from asyncrl.run_secret import RUN_SECRET_ENV, secret_for
from asyncrl.transport.batches import (
    batch_path,
    decode_batch,
    done_path,
    encode_batch,
    wait_for_batch,
    write_batch,
)
from asyncrl.types import TrainingBatch
from asyncrl.waiting import Wait

logger = get_logger(__name__)

END_OF_RUN = TrainingBatch(step=0, samples=[])


class BatchSender(Protocol):
    def send(self, batch: TrainingBatch) -> None: ...
    def finish(self) -> None: ...


class BatchReceiver(Protocol):
    def receive(self, step: int, timeout: float | None = None) -> TrainingBatch | None:
        """Batch `step`, or None once the orchestrator has said it sends no more."""
        ...

    def close(self) -> None: ...


class FilesystemSender:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def send(self, batch: TrainingBatch) -> None:
        write_batch(self.run_dir, batch)

    def finish(self) -> None:
        done_path(self.run_dir).parent.mkdir(parents=True, exist_ok=True)
        done_path(self.run_dir).touch()


class FilesystemReceiver:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def receive(self, step: int, timeout: float | None = None) -> TrainingBatch | None:
        def finished_without_it() -> bool:
            return done_path(self.run_dir).exists() and not batch_path(self.run_dir, step).exists()

        return wait_for_batch(self.run_dir, step, timeout=timeout, stop_if=finished_without_it)

    def close(self) -> None:
        pass


CHANNEL = "the zmq rollout transport"


class ZmqSender:
    def __init__(self, config: RolloutTransportConfig) -> None:
        import zmq

        from asyncrl.transport.zmq_auth import serve_curve

        secret = secret_for(CHANNEL, config.host)
        self.context = zmq.Context()  # its own: the CURVE authenticator is one per context
        self.socket = self.context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, config.hwm)
        self.authenticator = serve_curve(self.context, self.socket, secret) if secret else None
        self.socket.bind(f"tcp://{config.host}:{config.port}")

    def send(self, batch: TrainingBatch) -> None:
        self.socket.send(encode_batch(batch))  # blocks at the high-water mark: backpressure

    def finish(self) -> None:
        self.socket.send(encode_batch(END_OF_RUN))
        self.close(linger=10_000)

    def close(self, linger: int = 0) -> None:
        self.socket.close(linger=linger)
        if self.authenticator is not None:
            self.authenticator.stop()
        self.context.term()


class ZmqReceiver:
    def __init__(self, config: RolloutTransportConfig) -> None:
        import zmq

        from asyncrl.transport.zmq_auth import connect_curve

        secret = secret_for(CHANNEL, config.host)
        self.zmq = zmq
        self.endpoint = f"tcp://{config.host}:{config.port}"
        self.socket = zmq.Context.instance().socket(zmq.PULL)
        self.socket.setsockopt(zmq.RCVHWM, config.hwm)
        if secret:
            connect_curve(self.socket, secret)
        self.socket.connect(self.endpoint)
        self.secured = "CURVE" if secret else f"no CURVE: ${RUN_SECRET_ENV} is unset here"

    def receive(self, step: int, timeout: float | None = None) -> TrainingBatch | None:
        # a batch is usually moments away: stay quiet unless the wait gets long
        wait = Wait(f"batch {step} from {self.endpoint} ({self.secured}; the orchestrator needs "
                    "the same)", logger, timeout, first_report_after=30)  # fmt: skip
        while not self.socket.poll(int(1000 * min(1.0, timeout or 1.0))):
            wait.check()  # raises TimeoutError past `timeout`
        batch = decode_batch(self.socket.recv(), self.endpoint)
        if batch.step == 0 and not batch.samples:
            return None
        if batch.step != step:
            raise ValueError(f"{self.endpoint}: received batch {batch.step}, expected {step}")
        return batch

    def close(self) -> None:
        self.socket.close(linger=0)


def batch_sender(config: RolloutTransportConfig, run_dir: Path) -> BatchSender:
    return ZmqSender(config) if config.type == "zmq" else FilesystemSender(run_dir)


def batch_receiver(config: RolloutTransportConfig, run_dir: Path) -> BatchReceiver:
    return ZmqReceiver(config) if config.type == "zmq" else FilesystemReceiver(run_dir)
