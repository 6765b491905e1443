"""The orchestrator's checkpoint and resume: its progress (the last step it batched), its
buffer and its seed counter, as JSON under `checkpoints/step_N/orchestrator/`.

A batch once written is final — the trainer may already have trained on it — so a resumed
orchestrator goes on after the last batch on disk, not after its checkpoint; only its metrics
records after that batch are withdrawn (they belong to batches it will make again).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from asyncrl.checkpoint.layout import checkpoint_dir, mark_complete, prune, resolve_resume_step
from asyncrl.config.orchestrator import CheckpointConfig
from asyncrl.fs import atomic_write_bytes
from asyncrl.log import get_logger
from asyncrl.monitor.metrics import forget_metrics_after
from asyncrl.orchestrator.buffer import Buffer
from asyncrl.run.layout import checkpoints_dir, metrics_file, rollouts_dir, samples_dir
from asyncrl.step_dirs import remove_staging_leftovers, step_dirs
from asyncrl.transport.batches import done_path, last_batch_from

logger = get_logger(__name__)

STATE = "state.json"


@dataclass(frozen=True)
class Resumed:
    step: int  # generation goes on with step + 1 (0: a fresh start)
    seeds_used: int | None  # the seed counter to continue from, when a checkpoint had one


def resume(ckpt: CheckpointConfig, run_dir: Path, buffer: Buffer) -> Resumed:
    """Where generation resumes, with the buffer restored as `ckpt.skip_buffer` allows and the
    step as `ckpt.skip_progress` does."""
    checkpoints = step_dirs(checkpoints_dir(run_dir))
    own = [rollouts_dir(run_dir), samples_dir(run_dir)]
    for folder in own + [path / "orchestrator" for _, path in checkpoints]:
        remove_staging_leftovers(folder)  # what a crash left half-written
    step = resolve_resume_step(ckpt.resume_step, run_dir, ("orchestrator",))
    seeds_used = None
    if step is None:
        if ckpt.resume_step is None:
            return Resumed(0, None)
        step = 0  # restarted before its first checkpoint
    else:
        state = json.loads((checkpoint_dir(run_dir, step, "orchestrator") / STATE).read_text())
        if not ckpt.skip_buffer:
            buffer.load_state(state["buffer"])
        seeds_used = state["seeds_used"]
    written = last_batch_from(run_dir, step)
    done_path(run_dir).unlink(missing_ok=True)
    for role in ("orchestrator", "eval"):
        forget_metrics_after(metrics_file(run_dir), written, role=role)
    logger.info(
        "orchestrator: resumed from the checkpoint of step %d; batches up to %d were already "
        "written", step, written,
    )  # fmt: skip
    return Resumed(0 if ckpt.skip_progress else written, seeds_used)


def maybe_checkpoint(
    ckpt: CheckpointConfig, run_dir: Path, step: int, buffer: Buffer, seeds_used: int
) -> None:
    """Every `ckpt.interval` steps: the state, then its COMPLETE marker, then pruning."""
    if not ckpt.interval or step % ckpt.interval:
        return
    directory = checkpoint_dir(run_dir, step, "orchestrator")
    state = {"step": step, "buffer": buffer.state(), "seeds_used": seeds_used}
    atomic_write_bytes(directory / STATE, json.dumps(state).encode())
    mark_complete(directory, step)
    prune(run_dir, "orchestrator", ckpt.keep_last, ckpt.keep_interval)
