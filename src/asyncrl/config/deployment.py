"""What `deployment: auto` becomes on a machine: colocated (trainer and engine take turns on one
device) or disaggregated (each role on its own device or cores, generating while training)."""

from __future__ import annotations


def choose_deployment(launcher: str, gpus: int, cores: int) -> tuple[str, str]:
    """What `deployment: auto` becomes on a machine with `gpus` GPUs and `cores` usable CPU
    cores, and why. Pure, so every machine can be tested.

    One GPU is one device: trainer and engine must share it, so they take turns (colocated,
    as TRL and verl do there). Several GPUs, or several CPU cores, give each role its own
    device or cores, and generation then runs while the trainer steps: on a 2-core CPU that
    made 1.4x the steps per second of taking turns (benchmarks/RESULTS.md)."""
    if launcher == "ray":
        return "disaggregated", "Ray places every role as an actor of its own"
    if gpus == 1:
        return "colocated", "one GPU: trainer and engine take turns on it"
    if gpus > 1:
        return "disaggregated", f"{gpus} GPUs: the engine generates while the trainer steps"
    if cores >= 2:
        return "disaggregated", (
            f"{cores} CPU cores: trainer and engine each on its own, generating while training"
        )
    return "colocated", "one CPU core: trainer and engine take turns on it"


def machine_deployment(launcher: str) -> tuple[str, str]:
    """`choose_deployment` for this machine."""
    from asyncrl.cpu_affinity import usable_cores
    from asyncrl.gpu_presence import gpu_count

    return choose_deployment(launcher, gpu_count(), len(usable_cores()))
