"""Where a (re)started trainer picks up: its last checkpoint, or the initial weights as step 0
when it is asked to resume before its first one. What the dead trainer made after that step
(broadcasts, its metrics records) is withdrawn, and the resumed weights are published again
when their broadcast is gone, so servers on a withdrawn future go back to them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from asyncrl.checkpoint.layout import checkpoint_dir, resolve_resume_step
from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger
from asyncrl.monitor.metrics import forget_metrics_after
from asyncrl.run.layout import broadcasts_dir, checkpoints_dir, metrics_file
from asyncrl.step_dirs import remove_staging_leftovers
from asyncrl.trainer.checkpoint import load_trainer_checkpoint
from asyncrl.trainer.parallel import Ranks
from asyncrl.trainer.weights_out import publish_served_base, republish_version
from asyncrl.transport.broadcast import forget_broadcasts_after
from asyncrl.transport.weights.route import WeightRoute

logger = get_logger(__name__)


def resume(
    config: TrainerConfig,
    run_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ranks: Ranks,
) -> int:
    """The step training resumes after (0 for a fresh start). Broadcasts and trainer metrics
    records the crashed run made after that step are removed: they belong to a future this run
    will redo. Asked to resume with no checkpoint yet (a restart early in the run), it starts
    from the initial weights as step 0."""
    root = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    if ranks.is_main:  # what a crash left half-written
        remove_staging_leftovers(broadcasts_dir(run_dir))
        remove_staging_leftovers(root or checkpoints_dir(run_dir))
    step = resolve_resume_step(config.resume_step, run_dir, ("trainer",), root)
    if config.resume_step is None:
        return 0
    if step is not None:
        load_trainer_checkpoint(
            checkpoint_dir(run_dir, step, "trainer", root), model, optimizer, scheduler, ranks
        )
    step = step or 0
    if ranks.is_main:
        forget_broadcasts_after(run_dir, step)
        forget_metrics_after(metrics_file(run_dir), step, role="trainer")
    logger.info("trainer: resumed from the checkpoint of step %d", step)
    return step


def republish_on_resume(
    config: TrainerConfig,
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    route: WeightRoute | None,
    ranks: Ranks,
) -> None:
    """Publish the resumed weights as version `step` again: servers running a withdrawn future
    go back to them, and a fresh server gets the weights the resumed run continues from rather
    than waiting for the next step (the route decides what that takes: files only when their
    broadcast is gone, NCCL always, a colocated engine nothing — it starts from them).
    First, at every start, a QLoRA trainer that serves its dequantized base publishes that base
    (the servers need it before any adapter, a fresh run's first one included)."""
    publish_served_base(config, run_dir, model, ranks)
    if config.resume_step is None:
        return  # a fresh start
    if republish_version(route, step, model, ranks):
        logger.info("trainer: republished the weights of step %d for the servers", step)
