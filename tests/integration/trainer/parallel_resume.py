"""Checkpoint resharding under torchrun: `save` takes step 1, writes a checkpoint, then takes
step 2 (the uninterrupted run); `resume` loads the checkpoint on however many ranks it runs on
and takes the same step 2. Rank 0 writes OUT/<mode>.safetensors with the parameters after
step 2.

    python -m torch.distributed.run --standalone --nproc-per-node N parallel_resume.py \\
        MODEL CHECKPOINT save|resume OUT
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from parallel_step import build_trainer, fixed_batch, take_step, trained_parameters
from safetensors.torch import save_file

from asyncrl.trainer.checkpoint import load_trainer_checkpoint, save_trainer_checkpoint
from asyncrl.trainer.parallel import close_ranks, init_ranks


def main() -> None:
    model_dir, checkpoint, mode, out = (
        sys.argv[1],
        Path(sys.argv[2]),
        sys.argv[3],
        Path(sys.argv[4]),
    )
    ranks = init_ranks(int(os.environ.get("WORLD_SIZE", "1")), timeout=120)
    try:
        trainer = build_trainer(model_dir, "grpo_clip", lora=False, ranks=ranks)
        parts = (trainer.model, trainer.optimizer, trainer.scheduler)
        if mode == "save":
            take_step(trainer, fixed_batch("even"), ranks, version=0)
            save_trainer_checkpoint(checkpoint, 1, *parts, ranks=ranks)
        else:
            assert load_trainer_checkpoint(checkpoint, *parts, ranks=ranks) == 1
        take_step(trainer, fixed_batch("uneven"), ranks, version=1)
        tensors = trained_parameters(trainer, ranks)
        if tensors is not None:
            out.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(out / f"{mode}.safetensors"))
    finally:  # a rank that finished meets the others before closing (not when failing)
        close_ranks(ranks, wait_for_peers=sys.exc_info()[0] is None)


if __name__ == "__main__":
    main()
