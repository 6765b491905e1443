"""Where each of a run's files lives, and how the trainer finds the run: by the name its config
gives, never by looking for whichever `run_*` directory is there."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncrl.run.layout import (
    batch_file,
    broadcast_dir,
    broadcasts_lock,
    checkpoints_dir,
    cluster_probes_dir,
    config_file,
    find_run_dir,
    finished_marker,
    heartbeat_file,
    log_file,
    metrics_file,
    roles_record,
    rollouts_done,
    run_dir,
    run_name_of,
    samples_file,
    served_base_dir,
    tensorboard_dir,
)


@dataclass
class Placement:
    output_dir: str
    run_name: str


def test_every_entry_lands_where_the_docs_list_it(tmp_path: Path) -> None:
    run = run_dir(tmp_path)
    where = {
        run: "run_default",
        config_file(tmp_path, "train"): "configs/train.yaml",
        log_file(tmp_path, "infer-0"): "logs/infer-0.log",
        roles_record(tmp_path): "logs/roles.json",
        heartbeat_file(tmp_path, "orch"): "heartbeats/orch",
        cluster_probes_dir(tmp_path): ".cluster_probe",
        batch_file(run, 3): "run_default/rollouts/step_3/batch.msgpack",
        rollouts_done(run): "run_default/rollouts/DONE",
        broadcast_dir(run, 4): "run_default/broadcasts/step_4",
        broadcasts_lock(run): "run_default/broadcasts/LOCK",
        served_base_dir(run): "run_default/served_base",
        checkpoints_dir(run): "run_default/checkpoints",
        metrics_file(run): "run_default/metrics.jsonl",
        samples_file(run, 5): "run_default/samples/step_5.jsonl",
        tensorboard_dir(run): "run_default/tensorboard",
        finished_marker(run): "run_default/FINISHED",
    }
    assert {path.relative_to(tmp_path).as_posix(): rel for path, rel in where.items()} == {
        rel: rel for rel in where.values()
    }


def test_a_run_name_round_trips_and_other_directories_have_none(tmp_path: Path) -> None:
    assert run_dir(tmp_path, "ablation-2") == tmp_path / "run_ablation-2"
    assert run_name_of(run_dir(tmp_path, "ablation-2")) == "ablation-2"
    assert run_name_of(tmp_path / "configs") is None
    assert run_name_of(tmp_path / "run_") is None


@pytest.mark.parametrize("name", ["", "a/b", "."])
def test_a_run_name_that_is_not_one_path_component_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="run name"):
        run_dir(tmp_path, name)


def test_the_trainer_waits_for_its_own_run_not_the_newest_one(tmp_path: Path) -> None:
    run_dir(tmp_path, "someone_else").mkdir()  # newer than the run it is told to use
    ours = run_dir(tmp_path, "ours")
    timer = threading.Timer(0.3, ours.mkdir)
    timer.start()
    try:
        assert find_run_dir(Placement(str(tmp_path), "ours"), timeout=30) == ours
    finally:
        timer.cancel()


def test_waiting_for_a_run_that_never_comes_names_it(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError, match="run_missing"):
        find_run_dir(Placement(str(tmp_path), "missing"), timeout=0.2)
