"""N trainer ranks (FSDP2 over gloo, real processes started by torchrun) compute what one
process computes: the same gradient and the same parameters after an optimizer step, for
every loss, with and without LoRA, for even, uneven and one-sample batches, with gradient
accumulation, ZeRO-2, and a KL term to a reference model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


def run_ranks(
    model_dir: Path, out: Path, ranks: int, script: Path = HERE / "parallel_step.py", *extra: object
) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", str(script), str(model_dir), *map(str, extra),
               str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="module")
def one_and_two_ranks(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("parallel")
    run_ranks(tiny_model_dir, root / "one", 1)
    run_ranks(tiny_model_dir, root / "two", 2)
    return root / "one", root / "two"


def test_two_ranks_compute_the_gradient_and_update_of_one(
    one_and_two_ranks: tuple[Path, Path],
) -> None:
    one, two = one_and_two_ranks
    cases = sorted(path.name for path in one.glob("*.safetensors"))
    # losses × (full, LoRA) × batch shapes, + each loss with gradient accumulation, + ZeRO-2,
    # + β·KL to a reference (full and LoRA)
    assert len(cases) == 4 * 2 * 3 + 4 + 1 + 2
    for case in cases:
        single, double = load_file(one / case), load_file(two / case)
        assert single.keys() == double.keys(), case
        gradients = [k for k in single if k.startswith("grad/")]
        assert gradients and any(single[k].abs().max() > 1e-4 for k in gradients), case
        for key in single:
            assert_same(double[key], single[key], f"{case} {key}")


def assert_same(actual: torch.Tensor, expected: torch.Tensor, where: str) -> None:
    # gradients agree to float32 rounding (measured ≤ 4e-8); AdamW's first update,
    # lr·g/(|g|+ε), amplifies that where |g| ≈ ε, so parameters get 1e-5 at lr 1e-4
    is_gradient = where.split()[-1].startswith("grad/")
    tolerance = {"atol": 1e-7, "rtol": 1e-5} if is_gradient else {"atol": 1e-5, "rtol": 0.0}
    torch.testing.assert_close(actual, expected, **tolerance, msg=lambda m: f"{where}: {m}")


def test_gradient_accumulation_changes_the_passes_not_the_step(
    one_and_two_ranks: tuple[Path, Path],
) -> None:
    one, _ = one_and_two_ranks
    for loss in ("masked_is", "grpo_clip", "dapo", "dr_grpo"):
        once = load_file(one / f"{loss}-full-even-zero3-ga1.safetensors")
        accumulated = load_file(one / f"{loss}-full-even-zero3-ga3.safetensors")
        for key in once:
            assert_same(accumulated[key], once[key], f"{loss} {key}")


@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks(
    tiny_model_dir: Path, tmp_path: Path, saved_on: int, resumed_on: int
) -> None:
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    run_ranks(tiny_model_dir, out, saved_on, HERE / "parallel_resume.py", checkpoint, "save")
    run_ranks(tiny_model_dir, out, resumed_on, HERE / "parallel_resume.py", checkpoint, "resume")
    uninterrupted = load_file(out / "save.safetensors")
    resumed = load_file(out / "resume.safetensors")
    assert uninterrupted.keys() == resumed.keys()
    for key in uninterrupted:
        torch.testing.assert_close(resumed[key], uninterrupted[key], atol=1e-5, rtol=0)
    assert (checkpoint / "COMPLETE").exists()
    assert sorted(p.name for p in checkpoint.glob("rank_*.json")) == [
        f"rank_{r}.json" for r in range(saved_on)
    ]
