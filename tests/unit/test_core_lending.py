"""A core lent while its owner waits: the trainer's flag exists exactly while it waits, and the
engine's thread runs with a second torch thread, pinned to the lent core, exactly while the
flag exists; the launcher lends only where a one-process trainer sits beside the embedded
engine on cores of its own."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from asyncrl.config.loading import load_config
from asyncrl.config.rl import RLConfig
from asyncrl.core_lending import (
    LEND_FLAG_ENV,
    LENT_CPUS_ENV,
    Borrower,
    lend_for_good,
    lending,
    stop_lending,
)
from asyncrl.cpu_affinity import CPUS_ENV, usable_cores
from asyncrl.launch.local import lend_flag_of, thread_budget
from asyncrl.run.layout import heartbeat_file, lend_flag_file


def test_the_flag_exists_while_the_lender_waits_and_not_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "trainer_waiting"
    monkeypatch.setenv(LEND_FLAG_ENV, str(flag))
    with lending():
        assert flag.exists()
    assert not flag.exists()
    with pytest.raises(RuntimeError), lending():  # a wait that fails lends nothing after
        raise RuntimeError("the orchestrator died")
    assert not flag.exists()
    flag.touch()  # left behind by a trainer killed while it waited
    stop_lending()  # its successor, starting
    assert not flag.exists()
    monkeypatch.delenv(LEND_FLAG_ENV)
    with lending():  # not lent by the launcher: nothing written
        assert not flag.exists()


def test_a_borrower_needs_both_variables_and_sane_cores(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(LEND_FLAG_ENV, raising=False)
    monkeypatch.setenv(LENT_CPUS_ENV, "0")
    assert Borrower.from_environment() is None
    monkeypatch.setenv(LEND_FLAG_ENV, "/nonexistent/flag")
    monkeypatch.setenv(LENT_CPUS_ENV, "zero")
    with caplog.at_level("WARNING"):
        assert Borrower.from_environment() is None  # warned, not borrowing
    assert LENT_CPUS_ENV in caplog.text  # the variable that is wrong, by name


@pytest.mark.skipif(len(usable_cores()) < 2 or not hasattr(os, "sched_setaffinity"),
                    reason="needs two cores and Linux's thread affinity")  # fmt: skip
def test_the_engine_thread_runs_a_pinned_second_thread_only_while_the_flag_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    own_core, lent_core = usable_cores()[-1], usable_cores()[0]
    flag = tmp_path / "trainer_waiting"
    monkeypatch.setenv(LEND_FLAG_ENV, str(flag))
    monkeypatch.setenv(LENT_CPUS_ENV, str(lent_core))
    seen: list[tuple[bool, int, set[int]]] = []

    def engine() -> None:  # as the engine's own thread: pinned to its core, one torch thread
        os.sched_setaffinity(0, {own_core})
        torch.set_num_threads(1)
        borrower = Borrower.from_environment()
        assert borrower is not None
        for lent in (False, True, False, True):
            flag.touch() if lent else flag.unlink(missing_ok=True)
            borrower.before_step()
            torch.randn(64, 256) @ torch.randn(256, 256)
            workers = {core for thread in borrower.pinned
                       for core in os.sched_getaffinity(thread)}  # fmt: skip
            seen.append((lent, torch.get_num_threads(), workers))
        assert os.sched_getaffinity(0) == {own_core}  # its own thread never moved

    thread = threading.Thread(target=engine)
    thread.start()
    thread.join(timeout=60)
    assert [(lent, threads) for lent, threads, _ in seen] == [
        (False, 1), (True, 2), (False, 1), (True, 2)
    ]  # fmt: skip
    assert seen[1][2] == {lent_core} and seen[3][2] == {lent_core}


def test_the_launcher_lends_only_beside_the_embedded_engine_with_one_trainer_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("asyncrl.launch.local.usable_cores", lambda: [0, 1])
    base = ["--model", "m", "--deployment", "disaggregated",
            "--orchestrator.env", '[{"id": "reverse-text"}]']  # fmt: skip

    def flag(*extra: str) -> Path | None:
        return lend_flag_of(load_config(RLConfig, [], [*base, *extra]), tmp_path)

    assert flag() == lend_flag_file(tmp_path)
    assert flag().parent == heartbeat_file(tmp_path, "train").parent  # the launcher's folder
    assert flag("--lend_idle_cores", "false") is None
    assert flag("--inference.backend", "vllm") is None
    assert flag("--trainer.world_size", "2") is None
    split = thread_budget(lend_flag=tmp_path / "trainer_waiting")
    assert split["train"] == {"OMP_NUM_THREADS": "1", CPUS_ENV: "0",
                              LEND_FLAG_ENV: str(tmp_path / "trainer_waiting")}  # fmt: skip
    assert split["infer"][LENT_CPUS_ENV] == "0" and split["infer"][CPUS_ENV] == "1"
    assert LEND_FLAG_ENV not in thread_budget()["infer"]


def test_a_trainer_done_lends_for_good_until_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "trainer_waiting"
    monkeypatch.setenv(LEND_FLAG_ENV, str(flag))
    lend_for_good()  # after its last step: the run's last evaluations may use the core
    assert flag.exists()
    stop_lending()  # the next trainer here, starting
    assert not flag.exists()
