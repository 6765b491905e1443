"""`asyncrl train`: the GRPO trainer loop, readable top to bottom.

For each step s = 1, 2, …: wait for batch s from the orchestrator, pack it into micro-batches,
recompute logprobs under the current policy, apply the configured loss (normalised over the
whole step), take `num_iterations` optimizer steps, and publish weights version s. A step whose
loss or gradient norm is not finite is skipped (no update) and counted, and training goes on.

The same loop runs on every rank of a multi-process trainer (`parallel.py`): rank 0 receives
the batch and shares it, each rank trains on its share, and rank 0 publishes and logs.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from asyncrl.checkpoint.layout import checkpoint_dir, prune
from asyncrl.config.trainer import LossConfig, TrainerConfig
from asyncrl.core_lending import lend_for_good, lending, stop_lending
from asyncrl.log import get_logger
from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.monitor.spans import StepSpans
from asyncrl.run.layout import find_run_dir, metrics_file
from asyncrl.trainer.batch_source import BatchSource
from asyncrl.trainer.checkpoint import save_trainer_checkpoint
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.loss import LossInputs, compute_loss, loss_named
from asyncrl.trainer.micro_batches import MicroBatch, build_micro_batches
from asyncrl.trainer.model import load_model, precision_context, resolve_training_precision
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.parallel import (
    SINGLE_PROCESS,
    Ranks,
    close_ranks,
    init_ranks,
    plain_float,
    reduce_max,
    reduce_sums,
    shard_model,
    split_by_tokens,
    zero_weight_pass,
)
from asyncrl.trainer.reference import build_reference, maybe_sync_reference, reference_logprobs_for
from asyncrl.trainer.resume import republish_on_resume, resume
from asyncrl.trainer.step_stats import (
    StepStats,
    oldest_token_staleness,
    record_first_pass,
    record_last_update,
)
from asyncrl.trainer.weights_out import publish_version
from asyncrl.trainer.zero_advantage import samples_to_compute
from asyncrl.transport.rollout_transport import batch_receiver
from asyncrl.transport.weights.colocated import HostEngine
from asyncrl.transport.weights.registry import open_route, transport_named
from asyncrl.types import TrainingBatch

logger = get_logger(__name__)


def run_trainer(
    config: TrainerConfig,
    batch_timeout: float | None = None,
    host_engine: HostEngine | None = None,
) -> None:
    """`host_engine` starts the engine a colocated trainer serves (`trainer.colocated_inference`
    set); `asyncrl train` passes `asyncrl.colocation.engine_host.ColocatedInference`."""
    if config.colocated_inference is not None and host_engine is None:
        raise ValueError("trainer.colocated_inference is set but no engine host was given")
    if config.colocated_inference is None:  # a transport the config misnames: refused at once
        transport_named(config.weight_broadcast.type, "trainer.weight_broadcast.type")
    ranks = init_ranks(config.world_size, config.distributed_timeout)
    try:
        train_loop(config, ranks, batch_timeout, host_engine)
    except BaseException:
        close_ranks(ranks)
        raise
    close_ranks(ranks, wait_for_peers=True)


def train_loop(
    config: TrainerConfig,
    ranks: Ranks,
    batch_timeout: float | None,
    host_engine: HostEngine | None = None,
) -> None:
    """The loop every rank runs; rank 0 alone receives batches, writes metrics and hands the
    weights to its route (`asyncrl.transport.weights`: files, NCCL, a colocated engine, …)."""
    torch.manual_seed(config.seed)
    # `<output_dir>/run_<run_name>`, made by the orchestrator
    run_dir = find_run_dir(config, config.run_dir_timeout, "trainer.run_dir_timeout")
    metrics = MetricsWriter(metrics_file(run_dir), role="trainer") if ranks.is_main else None
    config, _ = resolve_training_precision(config, metrics)
    tokenizer = AutoTokenizer.from_pretrained(
        config.model, trust_remote_code=config.trust_remote_code
    )
    model, reference = build_policy(config, ranks)
    optimizer = build_optimizer(model, config)
    total_steps = config.max_steps * config.num_iterations if config.max_steps else -1
    scheduler = build_scheduler(optimizer, config, total_steps)
    route = open_route(config, run_dir, host_engine) if ranks.is_main else None
    logger.info(
        "trainer: run %s, model %s, loss %s, recipe %s, %d rank(s)",
        run_dir, config.model, config.loss.type, config.recipe, ranks.world_size,
    )  # fmt: skip

    stop_lending()  # a flag a trainer killed while it waited left behind
    receiver = batch_receiver(config.rollout_transport, run_dir) if ranks.is_main else None
    step = resume(config, run_dir, model, optimizer, scheduler, ranks) + 1
    batches = BatchSource(receiver, route, ranks, batch_timeout)
    spans, steps_since_log = StepSpans(), 0
    with contextlib.ExitStack() as cleanup:
        for part in (route, receiver):
            if part is not None:
                cleanup.callback(part.close)
        if route is not None:  # forms the NCCL group, starts a colocated engine, …
            route.start(step - 1, model)
        republish_on_resume(config, run_dir, step - 1, model, route, ranks)
        while config.max_steps is None or step <= config.max_steps:
            generated_before = route.generation_seconds() if route is not None else None
            waited = time.perf_counter()
            # while it waits, this core runs the engine's second thread (`core_lending.py`)
            lend = lending() if not ranks.distributed else contextlib.nullcontext()
            with spans.span("wait_batch"), lend:
                batch = batches.next(step)
            wait_time = time.perf_counter() - waited
            if batch is None:
                logger.info("trainer: the orchestrator is done; stopping after step %d", step - 1)
                break
            if route is not None and generated_before is not None:  # a colocated engine's share
                generated = route.generation_seconds() or 0.0
                spans.move("wait_batch", "generate", generated - generated_before)
            with spans.span("pack"):
                pad_token_id = tokenizer.pad_token_id or 0
                micro_batches = this_ranks_micro_batches(batch, config, ranks, pad_token_id)
            with spans.span("engine_sleep"):
                phases = route.before_step() if route is not None else {}
            with spans.span("train"):
                stats = train_step(
                    model, reference, optimizer, scheduler, micro_batches, config,
                    version=step - 1, ranks=ranks,
                )  # fmt: skip
            with spans.span("weights_out"):
                phases |= publish_version(route, step, model, ranks)
            with spans.span("checkpoint"):
                maybe_sync_reference(reference, model, step, config)
                maybe_checkpoint(config, run_dir, step, model, optimizer, scheduler, ranks)
            stats.max_staleness = max(stats.max_staleness, oldest_token_staleness(batch, step - 1))
            summary = stats.summary()
            steps_since_log += 1
            if metrics is not None and (
                step % config.logging_steps == 0 or step == config.max_steps
            ):
                summary["wait_time"] = wait_time
                # samples run forward and backward: those whose advantages are not all 0
                summary["computed_samples"] = len(samples_to_compute(batch, config.loss))
                record = {f"trainer/{key}": value for key, value in summary.items()}
                metrics.log(step, record | phases | spans.take("trainer", steps_since_log))
                steps_since_log = 0
            logger.info(
                "trainer: step %d loss %.4f kl %.2e grad_norm %.3f (%.1f s)",
                step, stats.loss, stats.mismatch_kl(), stats.grad_norm, stats.step_time,
            )  # fmt: skip
            step += 1
        if route is not None:
            route.finish()
        if not ranks.distributed:  # nothing left to train: the engine's last evaluations may
            lend_for_good()  # have this core too


def build_policy(
    config: TrainerConfig, ranks: Ranks
) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The policy in training mode and, when β·KL needs one, its frozen reference — each
    sharded across the ranks when there are several."""
    model = load_model(config, dense_mask=config.shared_prefix)
    model.train()
    reference = build_reference(model, config)
    model = shard_model(model, ranks, config.zero_level, config.recipe)
    if reference is not None:
        reference = shard_model(reference, ranks, config.zero_level, config.recipe)
    return model, reference


def this_ranks_micro_batches(
    batch: TrainingBatch, config: TrainerConfig, ranks: Ranks, pad_token_id: int
) -> list[MicroBatch]:
    """This rank's share of the samples that carry a gradient (balanced by tokens,
    `zero_advantage.py`), packed, weighted by the whole batch's totals as the configured loss's
    normalisation says."""
    only = samples_to_compute(batch, config.loss)  # not those whose advantages are all 0
    if ranks.distributed:
        lengths = [len(batch.samples[i].prompt_ids + batch.samples[i].completion_ids) for i in only]
        only = [only[j] for j in split_by_tokens(lengths, ranks.world_size)[ranks.rank]]
    return build_micro_batches(
        batch,
        config.sequence_len,
        config.per_device_train_batch_size,
        pad_token_id,
        loss_named(config.loss.type).normalisation,
        packing=config.sample_packing,
        only=only,
        min_micro_batches=config.gradient_accumulation_steps,
        shared_prefix=config.shared_prefix,
        loss_config=config.loss,
    )


def maybe_checkpoint(
    config: TrainerConfig,
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ranks: Ranks,
) -> None:
    """Every `save_steps`: weights, optimizer, scheduler and RNG under checkpoints/step_N."""
    if not config.save_steps or step % config.save_steps:
        return
    root = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    directory = checkpoint_dir(run_dir, step, "trainer", root)
    save_trainer_checkpoint(directory, step, model, optimizer, scheduler, ranks)
    if ranks.is_main:
        prune(run_dir, "trainer", config.keep_last, config.keep_interval, root)


def train_step(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    micro_batches: list[MicroBatch],
    config: TrainerConfig,
    version: int,
    ranks: Ranks = SINGLE_PROCESS,
) -> StepStats:
    """One batch: `num_iterations` optimizer updates, each accumulating every micro-batch.

    With several ranks each rank runs as many forward/backward passes as the rank with the
    most micro-batches, padding with zero-weight passes: FSDP's collectives pair up across
    ranks. A micro-batch without a token to train adds nothing to the gradient and is skipped
    (one process) or run at zero weight (several); a step with none anywhere updates nothing,
    keeps the learning-rate schedule in step, and is counted in `empty_steps`.
    """
    started = time.perf_counter()
    stats = StepStats(lr=scheduler.get_last_lr()[0], version=version)
    stats.tokens = sum(mb.packed.input_ids.numel() for mb in micro_batches) * config.num_iterations
    device = ranks.device if ranks.distributed else next(model.parameters()).device
    micro_batches = [mb.to(device) for mb in micro_batches]
    passes = int(reduce_max({"passes": len(micro_batches)}, ranks)["passes"])
    trained_tokens = reduce_sums({"t": sum(mb.num_loss_tokens for mb in micro_batches)}, ranks)
    if trained_tokens["t"] == 0:
        stats.empty_steps += 1
        logger.warning("trainer: batch of step %d has no token to train; no update", version + 1)
        for _ in range(config.num_iterations):
            scheduler.step()
        stats.step_time = time.perf_counter() - started
        stats.reduce(ranks)
        return stats
    loss_config = config.loss
    if loss_config.entropy_target is not None:  # the bonus's weight from this batch's entropy
        stats.entropy_coef = entropy_weight(micro_batches, loss_config, ranks)
        loss_config = loss_config.model_copy(update={"entropy_coef": stats.entropy_coef})
    else:
        stats.entropy_coef = loss_config.entropy_coef
    # each micro-batch's logprobs under the weights the batch started from: the proximal
    # policy of the updates after the first (`clip_against: proximal`)
    proximal: dict[int, torch.Tensor] = {}
    for iteration in range(config.num_iterations):
        total_loss = 0.0
        for index, mb in enumerate(micro_batches):
            if not mb.num_loss_tokens:
                if ranks.distributed:
                    zero_weight_pass(model, config, device)
                continue
            with precision_context(config.recipe, device):
                current = completion_logprobs(
                    model, mb.packed, mb.temperature,
                    entropy_grad=config.loss.entropy_coef > 0.0,
                )  # fmt: skip
            reference_logprobs = reference_logprobs_for(reference, model, mb, config)
            output = compute_loss(
                LossInputs(
                    logprobs=current.logprobs,
                    inference_logprobs=mb.inference_logprobs,
                    advantages=mb.advantages,
                    sequence_ids=mb.sequence_ids,
                    token_weights=mb.token_weights,
                    ref_logprobs=reference_logprobs,
                    proximal_logprobs=proximal.get(index),
                    entropies=current.entropy,
                ),
                loss_config,
            )
            if iteration == 0 and config.num_iterations > 1:
                proximal[index] = current.logprobs.detach()
            output.loss.backward()
            total_loss += output.loss.item()
            if iteration == 0:
                record_first_pass(
                    stats, mb, current.logprobs.detach(), current.entropy.detach(), output
                )
            if iteration == config.num_iterations - 1:
                before = proximal.get(index)
                record_last_update(stats, output, current.logprobs.detach(), before)
        for _ in range(passes - len(micro_batches)):
            zero_weight_pass(model, config, device)
        total_loss = reduce_sums({"loss": total_loss}, ranks)["loss"]
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        grad_norm = plain_float(norm)
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
    stats.reduce(ranks)
    return stats


def entropy_weight(micro_batches: list[MicroBatch], loss: LossConfig, ranks: Ranks) -> float:
    """The entropy bonus's weight for this batch under `entropy_target`: entropy_coef ×
    max(0, 1 − H/target), H the batch's sampled entropy, the mean −log p of its loss tokens as
    the server sampled them (every sample is trained when the bonus is on, so these are the
    whole batch's). Known before the step and a function of the batch alone, so a resumed run
    weighs each step as the first run did."""
    sums = reduce_sums(
        {
            "nll": sum(float(-mb.inference_logprobs.sum()) for mb in micro_batches),
            "tokens": sum(mb.num_loss_tokens for mb in micro_batches),
        },
        ranks,
    )
    if not sums["tokens"] or loss.entropy_target is None:
        return loss.entropy_coef
    entropy = sums["nll"] / sums["tokens"]
    return loss.entropy_coef * max(0.0, 1.0 - entropy / loss.entropy_target)
