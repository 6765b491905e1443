"""How many GPUs torch would see, asked without importing torch where no GPU can be.

The launcher of `asyncrl rl` decides the layout, the thread budget and the judge's threads
from whether there is a GPU, and it lives as long as the run: importing torch for that costs
1.4 s of CPU (AMD EPYC Zen 4) and ~300 MB on every start, a tax on CPU machines where the
answer is always no. torch sees a CUDA or ROCm device only through a device node of its
driver, so where there is none the answer is 0 without asking; anywhere else torch is asked,
exactly as before.
"""

from __future__ import annotations

from pathlib import Path

# NVIDIA's driver (one node per GPU), ROCm's kernel driver, WSL's GPU paravirtualisation
DRIVER_NODES = ("nvidia[0-9]*", "kfd", "dxg")


def could_have_gpus(dev: Path = Path("/dev")) -> bool:
    """Whether any GPU driver's device node exists (if not, torch can see no GPU)."""
    return any(next(dev.glob(pattern), None) is not None for pattern in DRIVER_NODES)


def gpu_count() -> int:
    """`torch.cuda.device_count()`, skipping torch's import on a machine with no GPU driver."""
    if not could_have_gpus():
        return 0
    import torch

    return torch.cuda.device_count()
