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


SECRET = "a-run-secret-of-enough-characters"


@pytest.mark.parametrize("stranger_keys", ["none", "its_own"])
def test_with_the_run_secret_a_stranger_cannot_take_batches(monkeypatch, stranger_keys) -> None:
    """PUSH deals round-robin to every connected peer: a stranger's PULL socket, plain or with
    CURVE keys of its own (knowing even the server's public key), must get nothing, and the
    trainer every batch in order."""
    monkeypatch.setenv("ASYNCRL_RUN_SECRET", SECRET)
    config = zmq_config()
    sender = batch_sender(config, Path("."))
    context = zmq.Context()
    stranger = context.socket(zmq.PULL)
    if stranger_keys == "its_own":
        from asyncrl.transport.zmq_auth import curve_keys

        stranger.curve_serverkey = curve_keys(SECRET).server_public
        stranger.curve_publickey, stranger.curve_secretkey = zmq.curve_keypair()
    stranger.connect(f"tcp://127.0.0.1:{config.port}")
    time.sleep(0.5)  # connected (or refused) before the trainer: first in the round-robin
    receiver = batch_receiver(config, Path("."))
    time.sleep(0.5)
    for step in (1, 2, 3, 4):
        sender.send(batch(step))
    try:
        assert [receiver.receive(step, timeout=10) for step in (1, 2, 3, 4)] == [
            batch(1), batch(2), batch(3), batch(4)
        ]  # fmt: skip
        assert stranger.poll(500) == 0
    finally:
        stranger.close(linger=0)
        context.term()
        receiver.close()
        sender.socket.close(linger=0)


def test_a_trainer_without_the_secret_is_not_let_in(monkeypatch) -> None:
    monkeypatch.setenv("ASYNCRL_RUN_SECRET", SECRET)
    config = zmq_config()
    sender = batch_sender(config, Path("."))
    monkeypatch.delenv("ASYNCRL_RUN_SECRET")
    receiver = batch_receiver(config, Path("."))
    with pytest.raises(TimeoutError, match=r"no CURVE: \$ASYNCRL_RUN_SECRET is unset here"):
        receiver.receive(1, timeout=1.0)
    receiver.close()
    sender.close()


def test_off_loopback_without_the_secret_zmq_refuses_to_start(monkeypatch) -> None:
    from asyncrl.config.base import ConfigError

    monkeypatch.delenv("ASYNCRL_RUN_SECRET", raising=False)
    # an address of no machine here (TEST-NET-3): nothing is bound or reached either way
    config = RolloutTransportConfig(type="zmq", host="203.0.113.7", port=free_port())
    with pytest.raises(ConfigError, match=r"ASYNCRL_RUN_SECRET"):
        batch_sender(config, Path("."))
    with pytest.raises(ConfigError, match=r"ASYNCRL_RUN_SECRET"):
        batch_receiver(config, Path("."))
