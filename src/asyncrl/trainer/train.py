"""`asyncrl train`: the GRPO trainer loop, readable top to bottom.

For each step s = 1, 2, …: wait for batch s from the orchestrator, pack it into micro-batches,
recompute logprobs under the current policy, apply the configured loss (normalised over the
whole step), take `num_iterations` optimizer steps, and publish weights version s. A step whose
loss or gradient norm is not finite is skipped (no update) and counted, and training goes on.
"""

from __future__ import annotations

import contextlib
import copy
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer

from asyncrl.checkpoint.layout import checkpoint_dir, prune, resolve_resume_step
from asyncrl.config.base import ConfigError
from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger
from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.trainer.checkpoint import load_trainer_checkpoint, save_trainer_checkpoint
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.loss import NORMALISATION, LossInputs, LossOutput, compute_loss
from asyncrl.trainer.micro_batches import MicroBatch, build_micro_batches
from asyncrl.trainer.model import load_model, precision_context, resolve_training_precision
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.run_dir import find_run_dir
from asyncrl.transport.broadcast import publish_marker, publish_weights, stable_steps
from asyncrl.transport.fingerprint import weights_fingerprint
from asyncrl.transport.nccl_broadcast import WeightSender
from asyncrl.transport.rollout_transport import batch_receiver

logger = get_logger(__name__)


def run_trainer(config: TrainerConfig, batch_timeout: float | None = None) -> None:
    check_supported(config)
    torch.manual_seed(config.seed)
    run_dir = find_run_dir(config.output_dir)
    metrics = MetricsWriter(run_dir / "metrics.jsonl", role="trainer")
    config, _ = resolve_training_precision(config, metrics)
    tokenizer = AutoTokenizer.from_pretrained(
        config.model, trust_remote_code=config.trust_remote_code
    )
    model = load_model(config)
    model.train()
    reference = build_reference(model, config)
    optimizer = build_optimizer(model, config)
    total_steps = config.max_steps * config.num_iterations if config.max_steps > 0 else -1
    scheduler = build_scheduler(optimizer, config, total_steps)
    sender = open_sender(config)
    logger.info(
        "trainer: run %s, model %s, loss %s, recipe %s",
        run_dir, config.model, config.loss.type, config.recipe,
    )  # fmt: skip

    receiver = batch_receiver(config.rollout_transport, run_dir)
    step = resume(config, run_dir, model, optimizer, scheduler) + 1
    while config.max_steps < 0 or step <= config.max_steps:
        waited = time.perf_counter()
        batch = receiver.receive(step, timeout=batch_timeout)
        wait_time = time.perf_counter() - waited
        if batch is None:
            logger.info("trainer: the orchestrator is done; stopping after step %d", step - 1)
            break
        micro_batches = build_micro_batches(
            batch,
            config.sequence_len,
            config.per_device_train_batch_size,
            tokenizer.pad_token_id or 0,
            NORMALISATION[config.loss.type],
            packing=config.sample_packing,
        )
        stats = train_step(
            model, reference, optimizer, scheduler, micro_batches, config, version=step - 1
        )
        publish(run_dir, step, model, sender, keep=config.max_async_level + 2)
        maybe_sync_reference(reference, model, step, config)
        maybe_checkpoint(config, run_dir, step, model, optimizer, scheduler)
        if step % config.logging_steps == 0 or step == config.max_steps:
            summary = {**stats.summary(), "wait_time": wait_time}
            metrics.log(step, {f"trainer/{key}": value for key, value in summary.items()})
        logger.info(
            "trainer: step %d loss %.4f kl %.2e grad_norm %.3f (%.1f s)",
            step, stats.loss, stats.mismatch_kl(), stats.grad_norm, stats.step_time,
        )  # fmt: skip
        step += 1
    receiver.close()
    if sender is not None:
        sender.close()


def resume(
    config: TrainerConfig,
    run_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> int:
    """The step training resumes after (0 for a fresh start). Broadcasts the crashed run made
    after that step are removed: they belong to a future this run will redo."""
    root = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    step = resolve_resume_step(config.resume_step, run_dir, ("trainer",), root)
    if step is None:
        return 0
    load_trainer_checkpoint(
        checkpoint_dir(run_dir, step, "trainer", root), model, optimizer, scheduler
    )
    for later in [s for s in stable_steps(run_dir) if s > step]:
        shutil.rmtree(run_dir / "broadcasts" / f"step_{later}", ignore_errors=True)
    logger.info("trainer: resumed from the checkpoint of step %d", step)
    return step


def maybe_checkpoint(
    config: TrainerConfig,
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> None:
    """Every `save_steps`: weights, optimizer, scheduler and RNG under checkpoints/step_N."""
    if not config.save_steps or step % config.save_steps:
        return
    root = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    directory = checkpoint_dir(run_dir, step, "trainer", root)
    save_trainer_checkpoint(directory, step, model, optimizer, scheduler)
    prune(run_dir, "trainer", config.keep_last, config.keep_interval, root)


def open_sender(config: TrainerConfig) -> WeightSender | None:
    broadcast = config.weight_broadcast
    if broadcast.type != "nccl":
        return None
    return WeightSender(
        broadcast.host, broadcast.port, broadcast.inference_world_size, broadcast.timeout
    )


def publish(
    run_dir: Path, step: int, model: torch.nn.Module, sender: WeightSender | None, keep: int
) -> None:
    """Weights version `step` out to inference: over NCCL/gloo, or as a checkpoint directory."""
    if sender is None:
        publish_weights(run_dir, step, model, keep=keep)
        return
    sender.send(step, model)
    publish_marker(run_dir, step, weights_fingerprint(model.named_parameters()), keep=keep)


@dataclass
class StepStats:
    loss: float = 0.0
    grad_norm: float = 0.0
    loss_tokens: int = 0
    masked_tokens: int = 0
    clipped_tokens: int = 0
    skipped_updates: int = 0
    kl_sum: float = 0.0
    entropy_sum: float = 0.0
    tokens: int = 0
    step_time: float = 0.0
    lr: float = 0.0
    version: int = 0  # weights version the batch is trained from (step - 1)
    max_staleness: int = 0  # versions between that and the oldest token's policy

    def mismatch_kl(self) -> float:
        return self.kl_sum / max(1, self.loss_tokens)

    def summary(self) -> dict[str, float]:
        tokens = max(1, self.loss_tokens)
        return {
            "loss": self.loss,
            "grad_norm": self.grad_norm,
            "mismatch_kl": self.mismatch_kl(),
            "entropy": self.entropy_sum / tokens,
            "masked_fraction": self.masked_tokens / tokens,
            "clip_fraction": self.clipped_tokens / tokens,
            "loss_tokens": self.loss_tokens,
            "skipped_updates": self.skipped_updates,
            "lr": self.lr,
            "step_time": self.step_time,
            "tokens_per_s": self.tokens / max(self.step_time, 1e-9),
            "max_staleness": self.max_staleness,
        }


def train_step(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    micro_batches: list[MicroBatch],
    config: TrainerConfig,
    version: int,
) -> StepStats:
    started = time.perf_counter()
    stats = StepStats(lr=scheduler.get_last_lr()[0], version=version)
    stats.tokens = sum(mb.packed.input_ids.numel() for mb in micro_batches) * config.num_iterations
    device = next(model.parameters()).device
    micro_batches = [mb.to(device) for mb in micro_batches]
    for iteration in range(config.num_iterations):
        total_loss = 0.0
        for mb in micro_batches:
            with precision_context(config.recipe, device):
                current = completion_logprobs(model, mb.packed, mb.temperature)
            reference_logprobs = reference_logprobs_for(reference, model, mb, config)
            output = compute_loss(
                LossInputs(
                    logprobs=current.logprobs,
                    inference_logprobs=mb.inference_logprobs,
                    advantages=mb.advantages,
                    sequence_ids=mb.sequence_ids,
                    token_weights=mb.token_weights,
                    ref_logprobs=reference_logprobs,
                ),
                config.loss,
            )
            output.loss.backward()
            total_loss += output.loss.item()
            if iteration == 0 and mb.num_loss_tokens:
                record_first_pass(stats, mb, current.logprobs.detach(), current.entropy, output)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
        if math.isfinite(total_loss) and math.isfinite(grad_norm):
            optimizer.step()
        else:
            stats.skipped_updates += 1
            logger.warning("trainer: non-finite loss %s / grad norm %s; update skipped",
                           total_loss, grad_norm)  # fmt: skip
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        stats.loss, stats.grad_norm = total_loss, grad_norm
    stats.step_time = time.perf_counter() - started
    return stats


def record_first_pass(
    stats: StepStats,
    mb: MicroBatch,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    output: LossOutput,
) -> None:
    """Metrics of the policy the batch was sampled against (before this step's updates)."""
    log_ratio = logprobs - mb.inference_logprobs  # log(π_train / π_inf) on sampled tokens
    finite = torch.isfinite(log_ratio)
    # k3 estimate of KL(π_inf || π_train): E[r − 1 − log r], r = π_train / π_inf
    stats.kl_sum += float((torch.exp(log_ratio) - 1 - log_ratio)[finite].sum())
    stats.entropy_sum += float(entropy.sum())
    stats.loss_tokens += mb.num_loss_tokens
    stats.masked_tokens += output.masked_tokens
    stats.clipped_tokens += output.clipped_tokens
    stats.max_staleness = max(stats.max_staleness, int(stats.version - mb.policy_versions.min()))


def check_supported(config: TrainerConfig) -> None:
    if config.loss.teacher_tau > 0:
        raise ConfigError("`loss.teacher_tau` is not supported yet (teacher logprobs)")
    if config.loss.beta > 0 and config.loss.type == "masked_is":
        raise ConfigError(
            "`loss.beta` (KL to a reference model) applies to the clipped losses; masked_is "
            "uses `loss.kl_tau` (KL to the inference policy)"
        )
    if config.weight_broadcast.type == "nccl" and config.lora:
        raise ConfigError(
            "`weight_broadcast.type: nccl` sends full weights; with LoRA use `filesystem`"
        )
    if config.sync_ref_model and config.lora:
        raise ConfigError("`sync_ref_model` with LoRA is not supported (the base is the reference)")


def build_reference(model: torch.nn.Module, config: TrainerConfig) -> torch.nn.Module | None:
    """A frozen copy of the starting policy when β·KL needs one; with LoRA the base model with
    adapters disabled is the reference, so no copy is made."""
    if config.loss.beta == 0 or config.lora:
        return None
    reference = copy.deepcopy(model).eval()
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
    return reference


@torch.no_grad()
def reference_logprobs_for(
    reference: torch.nn.Module | None,
    model: torch.nn.Module,
    mb: MicroBatch,
    config: TrainerConfig,
) -> torch.Tensor | None:
    if config.loss.beta == 0:
        return None
    context = model.disable_adapter() if reference is None else contextlib.nullcontext()
    with context, precision_context(config.recipe, mb.packed.input_ids.device):
        return completion_logprobs(reference or model, mb.packed, mb.temperature).logprobs


@torch.no_grad()
def maybe_sync_reference(
    reference: torch.nn.Module | None, model: torch.nn.Module, step: int, config: TrainerConfig
) -> None:
    """TR-DPO-style sync: ref ← α·policy + (1 − α)·ref every `ref_model_sync_steps`."""
    if reference is None or not config.sync_ref_model or step % config.ref_model_sync_steps:
        return
    alpha = config.ref_model_mixup_alpha
    for ref_param, param in zip(reference.parameters(), model.parameters(), strict=True):
        ref_param.mul_(1 - alpha).add_(param.detach(), alpha=alpha)
