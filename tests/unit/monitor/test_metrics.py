from __future__ import annotations

import math
from pathlib import Path

import pytest

from asyncrl.monitor.metrics import (
    MetricsWriter,
    forget_metrics_after,
    read_headers,
    read_metrics,
)


def test_one_line_per_step_and_role_read_back(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path, "trainer").log(1, {"trainer/loss": 0.5})
    MetricsWriter(path, "orchestrator").log(1, {"orchestrator/reward_mean": 0.25})
    MetricsWriter(path, "trainer").log(2, {"trainer/loss": math.nan})
    trainer = read_metrics(path, role="trainer")
    assert [r["step"] for r in trainer] == [1, 2]
    assert trainer[0]["trainer/loss"] == 0.5
    assert trainer[1]["trainer/loss"] is None  # NaN written as null: every line stays JSON
    assert len(read_metrics(path)) == 3


def test_torn_last_line_is_skipped_but_a_corrupt_middle_line_names_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path, "sft").log(1, {"sft/loss": 1.0})
    with path.open("a") as handle:
        handle.write('{"role": "sft", "step": 2, "sft/lo')
    assert [r["step"] for r in read_metrics(path)] == [1]
    with path.open("a") as handle:
        handle.write("\n" + '{"role": "sft", "step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON object"):
        read_metrics(path)


def test_run_headers_are_kept_apart_from_step_records(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, "trainer")
    writer.header({"precision/recipe": "fp32", "precision/bf16_slowdown": math.inf})
    writer.log(1, {"trainer/loss": 0.5})
    assert [r["step"] for r in read_metrics(path)] == [1]
    (header,) = read_headers(path, role="trainer")
    assert header["precision/recipe"] == "fp32"
    assert header["precision/bf16_slowdown"] is None  # inf written as null
    assert "step" not in header
    assert read_headers(path, role="sft") == []


def test_a_restarted_role_forgets_only_its_own_later_records(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    for step in (1, 2, 3):
        MetricsWriter(path, role="trainer").log(step, {"loss": step})
        MetricsWriter(path, role="orchestrator").log(step, {"reward": step})
    (tmp_path / ".metrics.jsonl.abc.tmp").write_text("a rewrite killed midway")
    forget_metrics_after(path, 1, role="trainer")
    assert [(r["role"], r["step"]) for r in read_metrics(path)] == [
        ("trainer", 1), ("orchestrator", 1), ("orchestrator", 2), ("orchestrator", 3)
    ]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.lock"]


def test_the_tail_reads_each_complete_line_once_and_starts_over_on_a_rewrite(
    tmp_path: Path,
) -> None:
    from asyncrl.monitor.metrics import MetricsTail

    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, role="trainer")
    tail = MetricsTail(path)
    assert tail.new_records() == []  # no file yet
    writer.log(1, {"trainer/loss": 1.0})
    writer.log(2, {"trainer/loss": 2.0})
    assert [r["step"] for r in tail.new_records()] == [1, 2]
    assert tail.new_records() == []  # nothing new
    with path.open("a") as handle:
        handle.write('{"role": "trainer", "step": 3')  # a role mid-write
    assert tail.new_records() == []
    with path.open("a") as handle:
        handle.write("}\n")
    assert [r["step"] for r in tail.new_records()] == [3]
    forget_metrics_after(path, 1)  # a resume rewrites the file
    assert [r["step"] for r in tail.new_records()] == [1]
    assert tail.rewound
