"""`asyncrl train` with `world_size` > 1: hand over to torch's elastic launcher (torchrun).

The process replaces itself with `python -m torch.distributed.run --standalone
--nproc-per-node N -m asyncrl.cli train <resolved config>`, so whatever started `asyncrl train`
(a terminal, `asyncrl rl`, a scheduler) supervises torchrun directly, and torchrun supervises the
ranks: when one dies, it stops the others and exits non-zero naming the rank and its exit code
or signal. Each rank asks the kernel to end it if torchrun dies (see `parallel.init_ranks`).

On several nodes, run torchrun yourself on each node with a matching total (`--nnodes`,
`--node-rank`, `--rdzv-endpoint`); `asyncrl train` then sees RANK set and runs as one rank.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from asyncrl.config.trainer import TrainerConfig
from asyncrl.log import get_logger

logger = get_logger(__name__)


def started_by_a_launcher() -> bool:
    """True inside a rank that torchrun (or another torch launcher) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def exec_ranks(config: TrainerConfig) -> None:
    """Replace this process with torchrun running `world_size` ranks of this config."""
    configs = Path(config.output_dir) / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    path = configs / "trainer_ranks.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={config.world_size}", "-m", "asyncrl.cli", "train", str(path),
    ]  # fmt: skip
    logger.info("trainer: starting %d ranks: %s", config.world_size, " ".join(command))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)
