"""`asyncrl sft`: the supervised warm-up loop, readable top to bottom.

Examples are tokenized once, packed padding-free into rows of `sequence_len` tokens, and each
optimizer step takes `per_device_train_batch_size × gradient_accumulation_steps` rows. The loss
is the mean negative log-likelihood over every answer token of the step (not a mean of
micro-batch means).
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import AutoTokenizer

from asyncrl.config.base import ConfigError
from asyncrl.config.sft import SFTConfig
from asyncrl.envs import load_environment
from asyncrl.evaluate import evaluate
from asyncrl.fs import atomic_directory
from asyncrl.log import console, get_logger
from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.run.layout import checkpoints_dir, metrics_file
from asyncrl.sft.data import episode_sample, sft_sample
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.model import load_model, precision_context, resolve_training_precision
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.packing import Sample, collate_rows, first_fit_decreasing

logger = get_logger(__name__)


def run_sft(config: SFTConfig) -> Path:
    """Train, save `<output_dir>/final`, evaluate greedily; returns the final checkpoint path."""
    torch.manual_seed(config.seed)
    output_dir = Path(config.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(
        config.model, trust_remote_code=config.trust_remote_code
    )
    if config.env.address is not None:
        raise ConfigError("env.address: this command runs the environment here; leave it unset")
    env = load_environment(config.env.id, config.env.args)
    examples = env.examples("train", config.num_examples)
    demonstration = getattr(env, "demonstration", None)  # multi-turn: a scripted episode
    samples = [
        sft_sample(example, tokenizer)
        if demonstration is None
        else episode_sample(demonstration(example), len(example.prompt), tokenizer)
        for example in examples
    ]
    rows = first_fit_decreasing([len(sample.input_ids) for sample in samples], config.sequence_len)
    rows_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    total_steps = config.max_steps or math.ceil(len(rows) / rows_per_step)
    logger.info(
        "sft: %d examples packed into %d rows of %d tokens (%.0f%% filled); %d steps",
        len(samples),
        len(rows),
        config.sequence_len,
        100 * sum(len(s.input_ids) for s in samples) / (len(rows) * config.sequence_len),
        total_steps,
    )

    metrics = MetricsWriter(metrics_file(output_dir), role="sft")
    config, _ = resolve_training_precision(config, metrics)
    model = load_model(config)
    model.train()
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps)
    row_order = _row_stream(len(rows), config.seed)

    with _progress() as progress:
        task = progress.add_task("sft", total=total_steps, loss=float("nan"), tps=0.0)
        for step in range(1, total_steps + 1):
            step_rows = [rows[next(row_order)] for _ in range(rows_per_step)]
            stats = train_step(model, optimizer, step_rows, samples, config, tokenizer.pad_token_id)
            stats["lr"] = scheduler.get_last_lr()[0]
            scheduler.step()
            if step % config.logging_steps == 0 or step == total_steps:
                metrics.log(step, {f"sft/{key}": value for key, value in stats.items()})
            progress.update(task, advance=1, loss=stats["loss"], tps=stats["tokens_per_s"])
            if config.save_steps and step % config.save_steps == 0 and step < total_steps:
                save_checkpoint(model, tokenizer, _checkpoint_dir(config) / f"step_{step}")

    final_dir = save_checkpoint(model, tokenizer, output_dir / "final")
    logger.info("sft: saved %s", final_dir)
    if config.eval_examples:
        result = evaluate(
            model,
            tokenizer,
            env,
            num_examples=config.eval_examples,
            max_tokens=config.eval_max_tokens,
        )
        metrics.log(total_steps, {"sft/eval_greedy_reward": result.mean_reward})
        logger.info(
            "sft: greedy mean reward on %d held-out prompts: %.4f",
            config.eval_examples,
            result.mean_reward,
        )
    return final_dir


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step_rows: list[list[int]],
    samples: list[Sample],
    config: SFTConfig,
    pad_token_id: int,
) -> dict[str, float]:
    """One optimizer step over `step_rows`, in micro-batches of `per_device_train_batch_size`."""
    started = time.perf_counter()
    size = config.per_device_train_batch_size
    device = next(model.parameters()).device
    micro_batches = [
        collate_rows(
            step_rows[start : start + size], samples, config.sequence_len, pad_token_id
        ).to(device)
        for start in range(0, len(step_rows), size)
    ]
    loss_tokens = sum(batch.num_loss_tokens for batch in micro_batches)
    total_loss = 0.0
    for batch in micro_batches:
        with precision_context(config.recipe, device):
            logprobs = completion_logprobs(model, batch).logprobs  # [loss tokens]
        loss = -logprobs.sum() / loss_tokens
        loss.backward()
        total_loss += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - started
    tokens = sum(batch.input_ids.numel() for batch in micro_batches)
    return {
        "loss": total_loss,
        "grad_norm": float(grad_norm),
        "loss_tokens": float(loss_tokens),
        "tokens_per_s": tokens / elapsed,
        "step_time": elapsed,
    }


def save_checkpoint(model: torch.nn.Module, tokenizer: object, path: Path) -> Path:
    """A Hugging Face directory (LoRA merged in), written atomically."""
    # merging LoRA is destructive, so merge a copy: training may go on after this save
    to_save = (
        copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model
    )
    with atomic_directory(path) as temporary:
        to_save.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)  # type: ignore[attr-defined]
    return path


def _checkpoint_dir(config: SFTConfig) -> Path:
    return Path(config.checkpoint_dir or checkpoints_dir(config.output_dir))


def _row_stream(num_rows: int, seed: int) -> Iterator[int]:
    """Row indices in a fresh random order every pass over the data."""
    rng = random.Random(seed)
    while True:
        order = list(range(num_rows))
        rng.shuffle(order)
        yield from order


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
