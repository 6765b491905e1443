"""Both batch transports behave the same: in order, an explicit end, corrupt input named."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import zmq

from asyncrl.config.transport import RolloutTransportConfig
from asyncrl.launch.inference_process import free_port
from asyncrl.transport.batches import BatchFileError
from asyncrl.transport.rollout_transport import batch_receiver, batch_sender
from asyncrl.types import TrainingBatch, TrainingSample


def batch(step: int, tokens: int = 2) -> TrainingBatch:
    sample = TrainingSample(
        prompt_ids=[1, 2], completion_ids=[step] * tokens, completion_mask=[True] * tokens,
        inference_logprobs=[-0.1] * tokens, advantages=[0.5] * tokens,
        policy_versions=[0] * tokens, temperature=1.0, env="e",
    )  # fmt: skip
    return TrainingBatch(step=step, samples=[sample])


def zmq_config(hwm: int = 10) -> RolloutTransportConfig:
    return RolloutTransportConfig(type="zmq", host="127.0.0.1", port=free_port(), hwm=hwm)


@pytest.mark.parametrize("kind", ["filesystem", "zmq"])
def test_batches_arrive_in_order_then_the_end(kind: str, tmp_path: Path) -> None:
    config = zmq_config() if kind == "zmq" else RolloutTransportConfig()
    sender = batch_sender(config, tmp_path)
    receiver = batch_receiver(config, tmp_path)
    for step in (1, 2, 3):
        sender.send(batch(step))
    sender.finish()
    assert [receiver.receive(step, timeout=10) for step in (1, 2, 3)] == [
        batch(1), batch(2), batch(3)
    ]  # fmt: skip
    assert receiver.receive(4, timeout=10) is None
    receiver.close()


def test_zmq_refuses_an_out_of_order_batch_and_a_corrupt_message() -> None:
    config = zmq_config()
    sender = batch_sender(config, Path("."))
    receiver = batch_receiver(config, Path("."))
    sender.send(batch(2))
    with pytest.raises(ValueError, match="received batch 2, expected 1"):
        receiver.receive(1, timeout=10)
    sender.socket.send(b"\x93not msgpack of a batch")
    with pytest.raises(BatchFileError, match=rf"tcp://127.0.0.1:{config.port}: not a valid"):
        receiver.receive(2, timeout=10)
    with pytest.raises(TimeoutError, match="gave up waiting for batch 2 from tcp:"):
        receiver.receive(2, timeout=0.2)
    receiver.close()
    sender.socket.close(linger=0)


def test_zmq_high_water_mark_holds_the_orchestrator_back() -> None:
    config = zmq_config(hwm=1)
    sender = batch_sender(config, Path("."))
    receiver = batch_receiver(config, Path("."))
    sent: list[int] = []

    def produce() -> None:  # ~1.5 MB batches: more than socket buffers hold
        for step in range(1, 21):
            sender.send(batch(step, tokens=150_000))
            sent.append(step)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    time.sleep(0.5)
    assert producer.is_alive() and len(sent) < 20  # blocked: the trainer is not reading
    assert [receiver.receive(step, timeout=10).step for step in range(1, 21)] == list(range(1, 21))
    producer.join(timeout=10)
    assert len(sent) == 20
    receiver.close()
    sender.socket.close(linger=0)
    assert zmq.Context.instance() is not None
