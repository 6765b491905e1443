from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from asyncrl.transport.batches import (
    BatchFileError,
    batch_path,
    encode_batch,
    read_batch,
    wait_for_batch,
    write_batch,
)
from asyncrl.types import TrainingBatch, TrainingSample


def sample(n: int = 3, **changes: object) -> TrainingSample:
    fields = dict(
        prompt_ids=[5, 6], completion_ids=list(range(10, 10 + n)), completion_mask=[True] * n,
        inference_logprobs=[-0.5] * n, advantages=[0.25] * n, policy_versions=[2] * n,
        temperature=1.0, env="reverse-text",
    )  # fmt: skip
    fields.update(changes)
    return TrainingSample(**fields)  # type: ignore[arg-type]


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    batch = TrainingBatch(step=3, samples=[sample(), sample(2, reward=0.5, task="t")])
    path = write_batch(tmp_path, batch)
    assert path == tmp_path / "rollouts" / "step_3" / "batch.msgpack"
    assert read_batch(tmp_path, 3) == batch
    assert [p.name for p in path.parent.iterdir()] == ["batch.msgpack"]  # no temporary left


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda data: data[: len(data) // 2], "not a valid training batch"),
        (lambda data: b"\x00garbage", "not a valid training batch"),
    ],
)
def test_corrupt_or_truncated_file_names_the_file(tmp_path: Path, damage, says: str) -> None:
    path = batch_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    path.write_bytes(damage(encode_batch(TrainingBatch(step=1, samples=[sample()]))))
    with pytest.raises(BatchFileError, match=f"{path}: {says}"):
        read_batch(tmp_path, 1)


def test_inconsistent_sample_is_refused_with_its_index(tmp_path: Path) -> None:
    bad = sample(advantages=[0.1])  # 1 advantage for 3 tokens
    write_batch(tmp_path, TrainingBatch(step=1, samples=[sample(), bad]))
    with pytest.raises(BatchFileError, match="sample 1: advantages has 1 entries for 3"):
        read_batch(tmp_path, 1)


def test_batch_of_another_step_is_refused(tmp_path: Path) -> None:
    path = batch_path(tmp_path, 2)
    path.parent.mkdir(parents=True)
    path.write_bytes(encode_batch(TrainingBatch(step=5, samples=[sample()])))
    with pytest.raises(BatchFileError, match="holds step 5, expected 2"):
        read_batch(tmp_path, 2)


def test_wait_returns_when_the_batch_lands_and_times_out_otherwise(tmp_path: Path) -> None:
    batch = TrainingBatch(step=1, samples=[sample()])
    writer = threading.Timer(0.3, write_batch, args=(tmp_path, batch))
    writer.start()
    started = time.monotonic()
    assert wait_for_batch(tmp_path, 1, timeout=10) == batch
    assert time.monotonic() - started >= 0.25
    with pytest.raises(TimeoutError, match="step_2"):
        wait_for_batch(tmp_path, 2, timeout=0.2)
