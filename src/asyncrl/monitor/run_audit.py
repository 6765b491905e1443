"""What a finished run directory must hold however often its roles died on the way: every step
trained and batched exactly once, no half-written file, every batch within its staleness
bounds, and final weights that load. The fault-injection benchmark and the restart tests ask it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.monitor.metrics import read_metrics
from asyncrl.run.layout import broadcast_dir, metrics_file
from asyncrl.transport.batches import BatchFileError, read_batch
from asyncrl.transport.broadcast import MARKER_ONLY, read_broadcast

STEP_ROLES = ("trainer", "orchestrator")
DCP_INDEX = ".metadata"  # torch.distributed.checkpoint's index of a checkpoint's shards


@dataclass
class RunAudit:
    steps_lost: dict[str, list[int]] = field(default_factory=dict)  # role -> missing steps
    steps_repeated: dict[str, list[int]] = field(default_factory=dict)  # role -> steps twice
    half_written: list[str] = field(default_factory=list)
    stale_batches: list[str] = field(default_factory=list)
    final_weights: str | None = None  # why they do not load (None: they do)

    @property
    def problems(self) -> list[str]:
        found = [f"{role} lost steps {steps}" for role, steps in self.steps_lost.items() if steps]
        found += [
            f"{role} repeated steps {steps}" for role, steps in self.steps_repeated.items() if steps
        ]
        found += [f"half-written: {path}" for path in self.half_written]
        found += self.stale_batches
        if self.final_weights is not None:
            found.append(f"final weights: {self.final_weights}")
        return found


def audit_run(
    run_dir: Path, max_steps: int, max_async_level: int, max_off_policy_steps: int
) -> RunAudit:
    audit = RunAudit()
    records = read_metrics(metrics_file(run_dir))
    for role in STEP_ROLES:
        counts = Counter(r["step"] for r in records if r["role"] == role)
        audit.steps_lost[role] = [s for s in range(1, max_steps + 1) if counts[s] == 0]
        audit.steps_repeated[role] = sorted(s for s, n in counts.items() if n > 1)
    audit.half_written = [
        str(path.relative_to(run_dir))
        for path in sorted(run_dir.rglob(".*"))
        if path.name != DCP_INDEX
    ]
    for step in range(1, max_steps + 1):
        audit.stale_batches += stale_samples(run_dir, step, max_async_level, max_off_policy_steps)
    audit.final_weights = final_weights_problem(run_dir, max_steps)
    return audit


def stale_samples(
    run_dir: Path, step: int, max_async_level: int, max_off_policy_steps: int
) -> list[str]:
    """Batch `step` breaks its bounds if a sample's newest token is older than step − 1 − k, or
    its oldest older than step − 1 − max_off_policy_steps (step − 1 − k when k = 0)."""
    try:
        batch = read_batch(run_dir, step)
    except (OSError, BatchFileError) as error:
        return [f"batch {step}: {error}"]
    newest_floor = step - 1 - max_async_level
    oldest_floor = newest_floor if max_async_level == 0 else step - 1 - max_off_policy_steps
    found = []
    for index, sample in enumerate(batch.samples):
        versions = sample.policy_versions or [newest_floor]
        if max(versions) < newest_floor or min(versions) < oldest_floor:
            found.append(
                f"batch {step} sample {index}: versions {min(versions)}..{max(versions)}, "
                f"bounds {oldest_floor} (oldest) / {newest_floor} (newest)"
            )
    return found


def final_weights_problem(run_dir: Path, step: int) -> str | None:
    """None when broadcast `step` is complete and its weights load."""
    try:
        broadcast = read_broadcast(broadcast_dir(run_dir, step))
    except ValueError as error:
        return str(error)
    if broadcast is None:
        return f"no complete broadcast of step {step}"
    if broadcast.kind in MARKER_ONLY:
        return None  # the weights went another way; only the marker is on disk
    from safetensors.torch import load_file

    try:
        for weights in broadcast.path.glob("*.safetensors"):
            load_file(weights)
    except (OSError, RuntimeError) as error:
        return f"{broadcast.path}: {error}"
    if not any(broadcast.path.glob("*.safetensors")):
        return f"{broadcast.path}: no safetensors file"
    return None
