"""`asyncrl rl` gives each role the GPUs it should see (one CUDA_VISIBLE_DEVICES per role
process), per deployment and per `gpu_ids`. This machine has no GPU: the devices the launcher
sees are given to it as a list, and what a role's process receives is read back from a real
child process started the way the supervisor starts roles."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asyncrl.config.loading import load_config
from asyncrl.config.restart import RestartConfig
from asyncrl.config.rl import RLConfig
from asyncrl.launch.gpu_placement import GPUPlacementError, place_gpus, visible_gpus
from asyncrl.launch.local import gpu_placement, role_specs, write_role_configs
from asyncrl.launch.supervisor import RoleSpec, SupervisedRole


def rl_config(tmp_path: Path, *overrides: str) -> RLConfig:
    args = ["--model", "m", "--output_dir", str(tmp_path / "out"), *overrides]
    return load_config(RLConfig, [], args)


def received(tmp_path: Path, config: RLConfig, visible: list[str]) -> dict[str, str]:
    """The CUDA_VISIBLE_DEVICES each role's process starts with (absent: `<unset>`)."""
    specs = role_specs(
        config, write_role_configs(config, tmp_path), tmp_path, gpus=gpu_placement(config, visible)
    )
    seen = {}
    for name, spec in specs.items():
        shown = tmp_path / f"seen-{name}"
        program = (
            f"import os; open({str(shown)!r}, 'w')"
            ".write(os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>'))"
        )
        child = RoleSpec(name, [sys.executable, "-c", program], [], spec.log, spec.heartbeat,
                         spec.env)  # fmt: skip
        SupervisedRole(child, RestartConfig()).process.wait(timeout=60)
        seen[name] = shown.read_text()
    return seen


def test_two_gpus_disaggregated_put_the_server_and_the_trainer_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = rl_config(tmp_path, "--deployment", "disaggregated")
    assert received(tmp_path, config, ["0", "1"]) == {"infer": "0", "train": "1", "orch": ""}


def test_colocated_gives_the_trainer_every_gpu_and_the_orchestrator_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = rl_config(tmp_path, "--deployment", "colocated")
    assert received(tmp_path, config, ["0", "1"]) == {"train": "0,1", "orch": ""}


def test_explicit_ids_count_among_the_gpus_the_launcher_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`CUDA_VISIBLE_DEVICES=2,3,5 asyncrl rl` with trainer [0] and inference [1, 2]: the trainer
    gets physical GPU 2, the server 3 and 5, as CUDA numbers them inside the launcher."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    config = rl_config(tmp_path, "--deployment", "disaggregated", "--gpu_ids.trainer", "[0]",
                       "--gpu_ids.inference", "[1,2]")  # fmt: skip
    assert received(tmp_path, config, visible_gpus()) == {"infer": "3,5", "train": "2", "orch": ""}


def test_a_machine_without_gpus_leaves_every_role_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = rl_config(tmp_path, "--deployment", "disaggregated")
    assert received(tmp_path, config, []) == {"infer": "<unset>", "train": "<unset>",
                                              "orch": "<unset>"}  # fmt: skip


@pytest.mark.parametrize(
    ("deployment", "visible", "ranks", "judge", "expected"),
    [
        ("disaggregated", ["0"], 1, False, {"train": ["0"], "infer": ["0"]}),  # they share it
        ("disaggregated", list("0123"), 2, False, {"train": ["2", "3"], "infer": ["0", "1"]}),
        ("disaggregated", list("012"), 1, True,
         {"train": ["2"], "infer": ["0", "1"], "judge": ["0", "1"]}),
        ("colocated", list("01"), 2, False, {"train": ["0", "1"]}),
    ],
)  # fmt: skip
def test_the_default_split_per_deployment(
    deployment: str, visible: list[str], ranks: int, judge: bool, expected: dict[str, list[str]]
) -> None:
    wanted = {"infer": None, "train": None, "judge": None}
    assert place_gpus(deployment, visible, wanted, ranks, judge).roles == expected


@pytest.mark.parametrize(
    ("deployment", "visible", "wanted", "ranks", "message"),
    [
        ("disaggregated", ["0", "1"], {"train": [2]}, 1,
         r"gpu_ids.trainer: \[2\] not among the 2 GPU\(s\) visible here"),
        ("disaggregated", [], {"infer": [0]}, 1,
         r"gpu_ids.inference is \[0\], but this machine shows no CUDA device"),
        ("colocated", ["0"], {"infer": [0]}, 1, "the trainer serves inference itself"),
        ("disaggregated", ["0", "1"], {"train": [1]}, 2, "1 GPU.s. for trainer.world_size 2"),
        ("disaggregated", ["0", "1"], {}, 2, "trainer.world_size 2 needs a GPU per rank beside"),
        ("disaggregated", ["0", "1"], {"train": [1, 1]}, 1, r"names a GPU twice"),
    ],
)  # fmt: skip
def test_what_cannot_be_placed_is_refused_naming_the_key(
    deployment: str, visible: list[str], wanted: dict, ranks: int, message: str
) -> None:
    with pytest.raises(GPUPlacementError, match=message):
        place_gpus(deployment, visible, wanted, ranks)


def test_ray_places_gpus_itself(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="`gpu_ids` places roles for the local launcher"):
        rl_config(tmp_path, "--launcher", "ray", "--gpu_ids.trainer", "[0]")
