"""Which precision a device runs fast, decided at start-up instead of assumed.

bfloat16 autocast doubles training throughput where the hardware multiplies bfloat16 natively
(CUDA devices of compute capability ≥ 8, CPUs with AVX512-BF16 or AMX) and is 20–100× slower
where it is emulated (an AVX2-only CPU runs a bf16 matmul at ~1.2 GFLOP/s against 85 in
float32). So `recipe: auto` and `dtype: auto` ask the device:

- CUDA: `torch.cuda.is_bf16_supported(including_emulation=False)`.
- CPU: a sub-second probe on one thread, the best of a few warmed-up 256×256 matmuls in each
  dtype, taking turns. The CPU's flags (`avx512_bf16`, `amx_bf16`, ARM `bf16`) are reported
  beside it but do not decide: oneDNN emulates bf16 on some CPUs that lack them, and a flag
  says nothing of the library's kernels.

`ASYNCRL_NATIVE_BF16=1|0` overrides the detection (a probe that misjudges, or a test).
Every role resolves its own precision on its own machine: the launcher may run elsewhere.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from asyncrl.log import get_logger

logger = get_logger(__name__)

Recipe = Literal["fp32", "bf16"]
OVERRIDE_VARIABLE = "ASYNCRL_NATIVE_BF16"
# bf16 must be clearly faster to be worth its rounding noise: at equal speed float32 wins
NATIVE_SPEEDUP = 1.25
PROBE_SIZE = 256
PROBE_REPEATS = 7
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX-512 BF16 and AMX; ARMv8.6 BF16


@dataclass(frozen=True)
class DeviceReport:
    """What a device says about bfloat16, and the evidence for it."""

    device_type: str  # "cpu", "cuda", …
    name: str  # the CPU model or GPU name, for logs and figures
    native_bf16: bool
    evidence: str  # why `native_bf16` is what it is, in words a user can check
    bf16_slowdown: float | None = None  # bf16 time ÷ float32 time of the probe (CPU only)


@dataclass(frozen=True)
class PrecisionChoice:
    """The recipe a role will run, the one the user asked for, and why they may differ."""

    recipe: Recipe
    requested: str
    reason: str
    device: DeviceReport

    def header(self) -> dict[str, object]:
        """The record of this choice in `metrics.jsonl`'s run header."""
        return {
            "precision/recipe": self.recipe,
            "precision/requested": self.requested,
            "precision/reason": self.reason,
            "precision/device": self.device.name,
            "precision/native_bf16": self.device.native_bf16,
            "precision/bf16_slowdown": self.device.bf16_slowdown,
        }


def default_device() -> torch.device:
    """Where the roles put their models: the first GPU if there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def choose_recipe(requested: str, device: DeviceReport) -> PrecisionChoice:
    """`auto` becomes `bf16` only on native hardware; an explicit `bf16` is honoured but warned
    about where it is slow. Pure: the device report is given, so any device can be tested."""
    if requested == "auto":
        recipe: Recipe = "bf16" if device.native_bf16 else "fp32"
        verdict = "native" if device.native_bf16 else "not native"
        reason = f"auto: bfloat16 is {verdict} on {device.name} ({device.evidence})"
        return PrecisionChoice(recipe, requested, reason, device)
    if requested not in ("fp32", "bf16"):
        raise ValueError(f"unknown precision recipe {requested!r}; expected auto, fp32 or bf16")
    if requested == "bf16" and not device.native_bf16:
        logger.warning(
            "recipe bf16 on %s, which does not run bfloat16 natively (%s): expect it to be much "
            "slower than `recipe: fp32` or `auto`",
            device.name,
            device.evidence,
        )
    return PrecisionChoice(requested, requested, f"{requested}: set in the config", device)  # type: ignore[arg-type]


def resolve_recipe(requested: str, device: torch.device | None = None) -> PrecisionChoice:
    """Probe the device (once per process), choose, and log the choice with its reason."""
    choice = choose_recipe(requested, describe_device(device or default_device()))
    logger.info("precision: recipe %s (%s)", choice.recipe, choice.reason)
    return choice


def choose_inference_dtype(
    requested: str, checkpoint_dtype: torch.dtype | None, device: DeviceReport
) -> tuple[torch.dtype, str]:
    """The dtype the inference engine holds weights in, and why.

    `auto` keeps the checkpoint's dtype, except that half-precision weights are served in
    float32 on a CPU without native bfloat16 (and bfloat16 becomes float16 on a GPU without
    it). An explicit dtype is honoured, with a warning where bfloat16 is slow.
    """
    names = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if requested != "auto":
        dtype = names[requested]
        if dtype == torch.bfloat16 and not device.native_bf16:
            logger.warning(
                "dtype bfloat16 on %s, which does not run it natively (%s): expect slow "
                "generation; `dtype: auto` would serve float32",
                device.name,
                device.evidence,
            )
        return dtype, f"{requested}: set in the config"
    stored = checkpoint_dtype or torch.float32
    if stored == torch.float32 or stored.itemsize > 4:
        return stored, f"auto: the checkpoint's {stored}"
    if device.native_bf16:
        return stored, f"auto: the checkpoint's {stored}; bfloat16 is native on {device.name}"
    if device.device_type == "cuda":
        return torch.float16, f"auto: {stored} checkpoint as float16 ({device.evidence})"
    return torch.float32, f"auto: {stored} checkpoint served in float32 ({device.evidence})"


@functools.cache
def describe_device(device: torch.device) -> DeviceReport:
    """The device's bfloat16 report; cached, so the CPU is probed once per process."""
    override = os.environ.get(OVERRIDE_VARIABLE)
    if device.type == "cuda":
        report = _describe_cuda(device)
    elif device.type == "cpu":
        report = _describe_cpu()
    else:
        report = DeviceReport(device.type, device.type, False, "no bfloat16 check for it")
    if override in ("0", "1"):
        evidence = f"{OVERRIDE_VARIABLE}={override}; detected: {report.evidence}"
        return DeviceReport(
            report.device_type, report.name, override == "1", evidence, report.bf16_slowdown
        )
    return report


def _describe_cuda(device: torch.device) -> DeviceReport:
    """Written for GPU machines; untested on this project's CPU-only CI."""
    name = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    return DeviceReport("cuda", name, native, f"compute capability {major}.{minor}")


def _describe_cpu() -> DeviceReport:
    slowdown = probe_bf16_slowdown()
    flags = sorted(cpu_flags() & set(CPU_BF16_FLAGS)) or ["none"]
    isa = torch.backends.cpu.get_cpu_capability()
    evidence = (
        f"bf16 matmul {_ratio_words(slowdown)} float32 in a probe; {isa}, bf16 flags: "
        f"{', '.join(flags)}"
    )
    return DeviceReport("cpu", cpu_model_name(), slowdown <= 1 / NATIVE_SPEEDUP, evidence, slowdown)


def probe_bf16_slowdown(size: int = PROBE_SIZE, repeats: int = PROBE_REPEATS) -> float:
    """Best-of-`repeats` time of a bf16 matmul ÷ that of a float32 one, after a warm-up call
    each (the first call of a dtype pays for kernel set-up). ~0.2 s where bf16 is emulated.

    On one thread, the two dtypes taking turns: the question is the kernel's speed, and a
    matmul this small split over threads times their wake-ups, while a neighbour's burst that
    lands on one dtype's calls only is outvoted by the other turns. (Best of 3 per dtype, one
    dtype after the other, on every thread, once judged a Zen 4 with AVX512-BF16 1.1× slower in
    bf16 where other start-ups of the same machine found it 1.8–3.1× faster.)

    One thread from the first kernel on, operands included: the launcher probes (for the
    engine's dtype) and then forks the roles, and a single OpenMP parallel region here (the
    operands' fill and casts ran on every thread) leaves libgomp's worker pool in the launcher,
    where a forked child that runs on two threads or more waits for those workers forever (a
    colocated run hung at its engine's first allocation)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        base = [torch.randn(size, size, generator=generator) for _ in range(2)]
        dtypes = (torch.float32, torch.bfloat16)
        operands = {dtype: [t.to(dtype) for t in base] for dtype in dtypes}
        best = dict.fromkeys(operands, float("inf"))
        for left, right in operands.values():
            torch.mm(left, right)
        for _ in range(repeats):
            for dtype, (left, right) in operands.items():
                started = time.perf_counter()
                torch.mm(left, right)
                best[dtype] = min(best[dtype], time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
    return max(best[torch.bfloat16], 1e-9) / max(best[torch.float32], 1e-9)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 `flags`, ARM `Features`); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _ratio_words(slowdown: float) -> str:
    if slowdown >= 1:
        return f"{slowdown:.1f}× slower than"
    return f"{1 / slowdown:.1f}× faster than"
