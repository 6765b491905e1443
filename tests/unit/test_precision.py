"""`recipe: auto` and `dtype: auto`: bfloat16 only where the device multiplies it natively."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from asyncrl.config.sft import SFTConfig
from asyncrl.monitor.metrics import MetricsWriter, read_headers
from asyncrl.precision import (
    CPU_BF16_FLAGS,
    DeviceReport,
    choose_inference_dtype,
    choose_recipe,
    cpu_flags,
    describe_device,
    probe_bf16_slowdown,
)
from asyncrl.trainer.model import resolve_training_precision

CPU_WITH_BF16 = DeviceReport(
    "cpu", "Intel Xeon (reported)", True, "bf16 matmul 2.0× faster than float32", 0.5
)
CPU_WITHOUT_BF16 = DeviceReport(
    "cpu", "AMD EPYC (reported)", False, "bf16 matmul 92.0× slower than float32", 92.0
)
# stand-ins for GPUs this project's machines do not have: only the decision is tested here
CUDA_AMPERE_STAND_IN = DeviceReport("cuda", "stand-in A100", True, "compute capability 8.0")
CUDA_TURING_STAND_IN = DeviceReport("cuda", "stand-in T4", False, "compute capability 7.5")


@pytest.mark.parametrize(
    ("device", "expected"),
    [(CPU_WITH_BF16, "bf16"), (CPU_WITHOUT_BF16, "fp32"),
     (CUDA_AMPERE_STAND_IN, "bf16"), (CUDA_TURING_STAND_IN, "fp32")],
)  # fmt: skip
def test_auto_picks_bf16_only_where_it_is_native(device: DeviceReport, expected: str) -> None:
    choice = choose_recipe("auto", device)
    assert choice.recipe == expected
    assert choice.requested == "auto"
    assert device.name in choice.reason and device.evidence in choice.reason


def test_explicit_bf16_without_native_support_runs_but_warns_with_the_slowdown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        choice = choose_recipe("bf16", CPU_WITHOUT_BF16)
    assert choice.recipe == "bf16"
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "92.0× slower" in warning.getMessage()
    assert "AMD EPYC" in warning.getMessage()


@pytest.mark.parametrize("device", [CPU_WITH_BF16, CPU_WITHOUT_BF16, CUDA_TURING_STAND_IN])
@pytest.mark.parametrize("requested", ["fp32", "bf16"])
def test_an_explicit_recipe_is_honoured_and_warned_about_only_where_slow(
    device: DeviceReport, requested: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        assert choose_recipe(requested, device).recipe == requested
    slow = requested == "bf16" and not device.native_bf16
    assert bool(caplog.records) == slow


@pytest.mark.parametrize(
    ("requested", "stored", "device", "expected"),
    [
        ("auto", torch.float32, CPU_WITH_BF16, torch.float32),  # never downcast on its own
        ("auto", torch.bfloat16, CPU_WITH_BF16, torch.bfloat16),
        ("auto", torch.bfloat16, CPU_WITHOUT_BF16, torch.float32),
        ("auto", torch.float16, CPU_WITHOUT_BF16, torch.float32),
        ("auto", torch.bfloat16, CUDA_AMPERE_STAND_IN, torch.bfloat16),
        ("auto", torch.bfloat16, CUDA_TURING_STAND_IN, torch.float16),
        ("auto", None, CPU_WITHOUT_BF16, torch.float32),
        ("bfloat16", torch.float32, CPU_WITHOUT_BF16, torch.bfloat16),  # asked for: honoured
        ("float32", torch.bfloat16, CPU_WITH_BF16, torch.float32),
    ],
)
def test_inference_dtype_auto_keeps_the_checkpoint_dtype_unless_it_is_slow_here(
    requested: str, stored: torch.dtype | None, device: DeviceReport, expected: torch.dtype
) -> None:
    dtype, reason = choose_inference_dtype(requested, stored, device)
    assert dtype == expected
    assert reason.startswith(requested)


def test_the_cpu_probe_agrees_with_the_cpu_flags() -> None:
    """Two independent reports of this CPU: its flags, and the timing of real matmuls (more
    repeats than start-up takes, so a noisy neighbour cannot flip the verdict). Without a bf16
    flag there is no native bf16 path, so bf16 must time slower. A flag does not make it
    faster: on an Intel Xeon (family 6 model 207, avx512_bf16) bf16 matmul ran 2.0x slower
    than float32 (benchmarks/RESULTS.md, 2026-12-02 evening), which is why `auto` goes by the
    timing, not the flags."""
    slowdown = probe_bf16_slowdown(repeats=7)
    assert 0 < slowdown < float("inf")
    if not cpu_flags() & set(CPU_BF16_FLAGS):
        assert slowdown > 1, f"no bf16 flag, yet bf16 matmul {1 / slowdown:.1f}× faster"


def test_the_override_variable_decides_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, native in (("1", True), ("0", False)):
        monkeypatch.setenv("ASYNCRL_NATIVE_BF16", value)
        describe_device.cache_clear()
        report = describe_device(torch.device("cpu"))
        assert report.native_bf16 is native
        assert f"ASYNCRL_NATIVE_BF16={value}" in report.evidence
    describe_device.cache_clear()


def test_resolving_a_config_writes_the_choice_to_the_run_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCRL_NATIVE_BF16", "0")
    describe_device.cache_clear()
    metrics = MetricsWriter(tmp_path / "metrics.jsonl", role="sft")
    config, choice = resolve_training_precision(SFTConfig(model="unused"), metrics)
    describe_device.cache_clear()
    assert isinstance(config, SFTConfig) and config.recipe == choice.recipe == "fp32"
    (header,) = read_headers(tmp_path / "metrics.jsonl")
    assert header["precision/recipe"] == "fp32"
    assert header["precision/requested"] == "auto"
    assert "ASYNCRL_NATIVE_BF16=0" in header["precision/reason"]


FORK_AFTER_PROBE = """
import os, sys, time
import torch
from asyncrl.precision import probe_bf16_slowdown
probe_bf16_slowdown()  # what the launcher runs before it forks the roles
pid = os.fork()
if pid == 0:  # a role with two threads, as a colocated trainer or a bigger machine's roles have
    torch.set_num_threads(2)
    torch.zeros((64, 4, 256, 64)).add_(1.0)
    (torch.randn(512, 512) @ torch.randn(512, 512)).sum()
    os._exit(0)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    time.sleep(0.1)
os.kill(pid, 9)
print("the forked child hung in its first parallel region")
sys.exit(3)
"""


def test_a_role_forked_after_the_probe_runs_on_several_threads() -> None:
    """The launcher probes bf16 before it forks the roles: the probe must leave no OpenMP pool
    behind, or a forked role on two threads or more waits for its workers forever."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_PROBE], capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "2"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
