"""One trainer step on fixed batches, run under torchrun with 1 or 2 ranks (gloo on CPU).

For every case (loss × LoRA × batch shape) it loads the model afresh, shards it across the
ranks, takes one `train_step` and writes, on rank 0, OUT/<case>.safetensors holding the full
gradient (captured just before the optimizer step) and the updated parameters. The 1-rank run
is the plain single-process trainer, so comparing the two files checks that N ranks compute
what one does.

    python -m torch.distributed.run --standalone --nproc-per-node 2 parallel_step.py MODEL OUT
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.parallel import (
    Ranks,
    close_ranks,
    full_state_dict,
    init_ranks,
)
from asyncrl.trainer.step_stats import StepStats
from asyncrl.trainer.train import build_policy, this_ranks_micro_batches, train_step
from asyncrl.types import TrainingBatch, TrainingSample

LOSSES = ("masked_is", "grpo_clip", "dapo", "dr_grpo")
# (prompt, completion) lengths of each batch; a length of 0 trained tokens = fully masked
SHAPES = {
    "even": [
        (random.Random(i).randint(5, 30), random.Random(-i).randint(3, 20)) for i in range(12)
    ],
    "uneven": [(150, 60), (6, 4), (5, 3), (7, 2)],  # one rank gets ~10× the other's tokens
    "lonely": [(20, 10)],  # one sample: the other rank only runs zero-weight passes
}


def fixed_batch(shape: str) -> TrainingBatch:
    rng = random.Random(shape)
    samples = []
    for index, (prompt, completion) in enumerate(SHAPES[shape]):
        mask = [True] * completion
        if shape == "even" and index == 3:
            mask = [False] * completion  # a truncated, fully masked sample
        advantage = rng.choice((-1.0, 1.0)) * rng.uniform(0.2, 1.0)
        if shape == "even" and index == 5:  # nothing to teach: the ranks split only the samples
            advantage = 0.0  # the trainer computes (`zero_advantage.py`)
        samples.append(
            TrainingSample(
                prompt_ids=[rng.randrange(4, 128) for _ in range(prompt)],
                completion_ids=[rng.randrange(4, 128) for _ in range(completion)],
                completion_mask=mask,
                # near the model's own logprobs (≈ −ln 128) but not equal: ratios ≠ 1, some clip
                inference_logprobs=[-4.85 + rng.uniform(-0.4, 0.4) for _ in range(completion)],
                advantages=[advantage] * completion,
                policy_versions=[0] * completion,
                temperature=rng.choice((1.0, 0.7)),
                env="test",
            )
        )
    return TrainingBatch(step=1, samples=samples)


@dataclass
class Trainer:
    config: TrainerConfig
    model: torch.nn.Module
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler


def build_trainer(
    model_dir: str,
    loss: str,
    lora: bool,
    ranks: Ranks,
    zero_level: int = 3,
    accumulation: int = 1,
    beta: float = 0.0,
) -> Trainer:
    # two packed rows per micro-batch: several samples per row, several micro-batches per rank
    config = TrainerConfig(
        model=model_dir, lora=lora, lora_rank=4, optimizer="adamw", recipe="fp32",
        learning_rate=1e-4, sequence_len=256, per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation, world_size=ranks.world_size,
        zero_level=zero_level, loss={"type": loss, "beta": beta},
    )  # fmt: skip
    torch.manual_seed(0)  # LoRA's initial A matrices: the same on every rank and in every run
    model, reference = build_policy(config, ranks)
    optimizer = build_optimizer(model, config)
    return Trainer(config, model, reference, optimizer, build_scheduler(optimizer, config, 10))


def take_step(trainer: Trainer, batch: TrainingBatch, ranks: Ranks, version: int = 0) -> StepStats:
    micro_batches = this_ranks_micro_batches(batch, trainer.config, ranks, pad_token_id=0)
    return train_step(
        trainer.model, trainer.reference, trainer.optimizer, trainer.scheduler, micro_batches,
        trainer.config, version=version, ranks=ranks,
    )  # fmt: skip


def trained_parameters(trainer: Trainer, ranks: Ranks) -> dict[str, torch.Tensor] | None:
    """The full trained parameters on rank 0 (None elsewhere), under `param/<name>`."""
    state = full_state_dict(trainer.model, ranks)
    if not ranks.is_main:
        return None
    state = state if state is not None else dict(trainer.model.state_dict())
    names = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    return {f"param/{n}": state[n].detach().cpu().contiguous() for n in names}


def run_case(model_dir: str, loss: str, lora: bool, shape: str, ranks: Ranks, out: Path,
             zero_level: int = 3, accumulation: int = 1, beta: float = 0.0) -> None:  # fmt: skip
    trainer = build_trainer(model_dir, loss, lora, ranks, zero_level, accumulation, beta)
    gradients: dict[str, torch.Tensor] = {}

    def capture(*_: object) -> None:
        for name, parameter in trainer.model.named_parameters():
            if parameter.grad is not None:
                grad = parameter.grad
                grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
                gradients[f"grad/{name}"] = grad.detach().cpu().clone()

    trainer.optimizer.register_step_pre_hook(capture)
    stats = take_step(trainer, fixed_batch(shape), ranks)
    tensors = trained_parameters(trainer, ranks)
    if tensors is not None:
        tensors |= {k: v.contiguous() for k, v in gradients.items()}
        tensors["stats/loss"] = torch.tensor([stats.loss], dtype=torch.float64)
        tensors["stats/loss_tokens"] = torch.tensor([stats.loss_tokens], dtype=torch.float64)
        name = f"{loss}-{'lora' if lora else 'full'}-{shape}-zero{zero_level}-ga{accumulation}"
        name += f"-beta{beta}" if beta else ""
        save_file(tensors, str(out / f"{name}.safetensors"))


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    ranks = init_ranks(int(os.environ.get("WORLD_SIZE", "1")), timeout=120)
    try:
        for loss in LOSSES:
            for lora in (False, True):
                for shape in SHAPES:
                    run_case(model_dir, loss, lora, shape, ranks, out)
            run_case(model_dir, loss, False, "even", ranks, out, accumulation=3)
        run_case(model_dir, "grpo_clip", False, "uneven", ranks, out, zero_level=2)
        for lora in (False, True):  # β·KL: a sharded reference copy, or the base under LoRA
            run_case(model_dir, "grpo_clip", lora, "even", ranks, out, beta=0.1)
    finally:  # a rank that finished meets the others before closing (not when failing)
        close_ranks(ranks, wait_for_peers=sys.exc_info()[0] is None)


if __name__ == "__main__":
    main()
