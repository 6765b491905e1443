"""The launcher's GPU count: 0 without torch where no GPU driver's device node exists, and
torch's own count wherever one does (so a GPU machine is asked exactly as before)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl import gpu_presence


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [([], False), (["null", "nvidiactl", "tty0"], False), (["nvidia0"], True),
     (["nvidia3", "nvidiactl"], True), (["kfd"], True), (["dxg"], True)],
)  # fmt: skip
def test_a_gpu_is_possible_only_beside_a_drivers_device_node(
    tmp_path: Path, nodes: list[str], expected: bool
) -> None:
    for name in nodes:
        (tmp_path / name).touch()
    assert gpu_presence.could_have_gpus(tmp_path) is expected


def test_the_count_is_torchs_wherever_a_gpu_could_be(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_presence, "could_have_gpus", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert gpu_presence.gpu_count() == 3
    monkeypatch.setattr(gpu_presence, "could_have_gpus", lambda: False)
    assert gpu_presence.gpu_count() == 0


def test_this_machine_agrees_with_torch() -> None:
    assert gpu_presence.gpu_count() == torch.cuda.device_count()
