"""Where each contestant's step goes, in the same six parts for every system: generation and
scoring on the step's critical path, training (forward, backward, optimizer), the weight
hand-off, waiting for a batch beyond those, and the rest. Plus, for asyncrl, the generation
that ran beside training (off the critical path)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from race_stats import mean_spans

PARTS = ("generation", "scoring", "training", "weight_sync", "waiting", "rest")


def asyncrl_decomposition(
    metrics: Path, budget: float, launched_wall: float
) -> tuple[dict[str, float], int]:
    """From the trainer's spans (`trainer/time/*`) and the orchestrator's per-group times, over
    the steps inside the budget; and how many steps that was."""
    trainer, orchestrator = [], []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if "step" not in record or record.get("time", 0.0) - launched_wall > budget:
            continue
        if record.get("role") == "trainer":
            trainer.append(
                {k.removeprefix("trainer/time/"): v for k, v in record.items() if "/time/" in k}
            )
        elif record.get("role") == "orchestrator":
            orchestrator.append(record)
    spans = mean_spans(trainer)
    scoring = statistics.fmean(
        r.get("orchestrator/group/score_seconds", 0.0) for r in orchestrator[5:] or orchestrator
    ) if orchestrator else 0.0  # fmt: skip
    generated = statistics.fmean(
        r.get("orchestrator/group/generate_seconds", 0.0) for r in orchestrator[5:] or orchestrator
    ) if orchestrator else 0.0  # fmt: skip
    wait = spans.get("wait_batch", 0.0)
    critical_generation = spans.get("generate", 0.0)  # colocated: the engine, during the wait
    overlapped = 0.0 if critical_generation else generated
    # colocated: scoring is on the path, inside the wait; disaggregated: beside training
    scoring_on_path = min(scoring, wait) if critical_generation else 0.0
    parts = {
        "step": spans.get("step", 0.0),
        "generation": critical_generation,
        "scoring": scoring_on_path,
        "training": spans.get("train", 0.0),
        "weight_sync": spans.get("weights_out", 0.0) + spans.get("engine_sleep", 0.0),
        "waiting": wait - scoring_on_path,
        "rest": spans.get("pack", 0.0) + spans.get("checkpoint", 0.0) + spans.get("other", 0.0),
        "generation_overlapped": overlapped,
    }
    return parts, len(trainer)


def trl_decomposition(steps: list[dict[str, float]]) -> dict[str, float]:
    """From `race_trl.py`'s spans: its batch preparation holds generation and scoring, its
    training step the preparation, and the optimizer step is timed by a callback."""
    spans = mean_spans(steps)
    generation, scoring = spans.get("generate", 0.0), spans.get("score", 0.0)
    training = spans.get("training_step", 0.0) - spans.get("prepare", 0.0)
    training += spans.get("optimizer", 0.0)
    parts = {
        "step": spans.get("step", 0.0),
        "generation": generation,
        "scoring": scoring,
        "training": training,
        "weight_sync": 0.0,  # the policy generates itself
        "waiting": 0.0,
        "snapshot": spans.get("snapshot", 0.0),
    }
    parts["rest"] = parts["step"] - sum(parts[p] for p in PARTS if p != "rest") - parts["snapshot"]
    parts["generation_overlapped"] = 0.0
    return parts


def generated_by_step(metrics: Path, batch: int, group: int) -> dict[int, int]:
    """Completions the server made up to each step: the batch's, and those of every group
    dropped on the way (no signal, too stale, aborted) — what learning per sample is counted
    against when a contestant filters groups."""
    total, counts = 0, {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("role") != "orchestrator" or "step" not in record:
            continue
        dropped = sum(v for k, v in record.items() if k.startswith("orchestrator/dropped/"))
        total += batch + int(dropped) * group
        counts[record["step"]] = total
    return counts
