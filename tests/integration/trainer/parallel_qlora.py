"""A QLoRA trainer (NF4 base) under torchrun with 1 or 2 ranks (gloo on CPU).

`run`: one step on a fixed uneven batch, a checkpoint, another step on an even batch. Rank 0
writes OUT/run.safetensors with the full gradient of the first step, the trained parameters
after each step, the dequantized base (as `qlora_served_base: dequantized` publishes it,
gathered from the shards) and the adapter as the weight broadcast gathers it.
`resume`: loads the checkpoint (written on any number of ranks) and takes the second step;
rank 0 writes OUT/resume.safetensors with the trained parameters after it.

    python -m torch.distributed.run --standalone --nproc-per-node N parallel_qlora.py \\
        MODEL CHECKPOINT run|resume OUT
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from parallel_step import Trainer, fixed_batch, take_step, trained_parameters
from safetensors.torch import save_file

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.checkpoint import load_trainer_checkpoint, save_trainer_checkpoint
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.parallel import Ranks, close_ranks, full_state_dict, init_ranks
from asyncrl.trainer.quantized_base import dequantized_base
from asyncrl.trainer.train import build_policy


def main() -> None:
    model_dir, checkpoint, mode, out = (
        sys.argv[1],
        Path(sys.argv[2]),
        sys.argv[3],
        Path(sys.argv[4]),
    )
    out.mkdir(parents=True, exist_ok=True)
    ranks = init_ranks(int(os.environ.get("WORLD_SIZE", "1")), timeout=120)
    try:
        trainer = build_qlora_trainer(model_dir, ranks)
        parts = (trainer.model, trainer.optimizer, trainer.scheduler)
        if mode == "resume":
            assert load_trainer_checkpoint(checkpoint, *parts, ranks=ranks) == 1
            take_step(trainer, fixed_batch("even"), ranks, version=1)
            tensors = trained_parameters(trainer, ranks)
            if tensors is not None:
                save_file(tensors, str(out / "resume.safetensors"))
            return
        gradients = capture_first_gradient(trainer)
        take_step(trainer, fixed_batch("uneven"), ranks, version=0)
        first = snapshot(trained_parameters(trainer, ranks))  # one process: live tensors
        save_trainer_checkpoint(checkpoint, 1, *parts, ranks=ranks)
        take_step(trainer, fixed_batch("even"), ranks, version=1)
        second = trained_parameters(trainer, ranks)
        base = dequantized_base(trainer.model, keep=ranks.is_main)
        gathered = full_state_dict(trainer.model, ranks)
        if first is None or second is None:
            return
        state = gathered if gathered is not None else trainer.model.state_dict()
        tensors = {k.replace("param/", "step1/"): v for k, v in first.items()}
        tensors |= {k.replace("param/", "step2/"): v for k, v in second.items()}
        tensors |= {f"base/{k}": v for k, v in base.items()} | gradients
        tensors |= {f"adapter/{k}": v.detach().clone() for k, v in state.items() if ".lora_" in k}
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "run.safetensors"))
    finally:  # a rank that finished meets the others before closing (not when failing)
        close_ranks(ranks, wait_for_peers=sys.exc_info()[0] is None)


def snapshot(tensors: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    return None if tensors is None else {k: v.clone() for k, v in tensors.items()}


def build_qlora_trainer(model_dir: str, ranks: Ranks) -> Trainer:
    config = TrainerConfig(
        model=model_dir, lora=True, qlora_bnb=True, lora_rank=4, optimizer="adamw",
        recipe="fp32", learning_rate=1e-3, sequence_len=256, per_device_train_batch_size=2,
        world_size=ranks.world_size, loss={"type": "grpo_clip"},
    )  # fmt: skip
    torch.manual_seed(0)  # the adapters' initial A matrices: the same on every rank and run
    model, reference = build_policy(config, ranks)
    optimizer = build_optimizer(model, config)
    return Trainer(config, model, reference, optimizer, build_scheduler(optimizer, config, 10))


def capture_first_gradient(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The full gradient just before the first optimizer step, under `grad/<name>`."""
    gradients: dict[str, torch.Tensor] = {}

    def capture(*_: object) -> None:
        if gradients:
            return
        for name, parameter in trainer.model.named_parameters():
            if parameter.grad is not None:
                grad = parameter.grad
                grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
                gradients[f"grad/{name}"] = grad.detach().cpu().clone()

    trainer.optimizer.register_step_pre_hook(capture)
    return gradients


if __name__ == "__main__":
    main()
