"""`asyncrl rl` gives each role the GPUs it should see (one CUDA_VISIBLE_DEVICES per role
process), per deployment and per `gpu_ids`. This machine has no GPU: the devices the launcher
sees are given to it as a list, and what a role's process receives is read back from a real
child process started the way the supervisor starts roles."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.loading import load_config, validate_config
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


def with_reward_model(tmp_path: Path, device: str = "cuda", **more: object) -> RLConfig:
    """A disaggregated run whose environment has a reward-model term on `device`."""
    term = {"type": "reward_model", "name": "rm", "model": "rm", "device": device}
    data = {
        "model": "m", "output_dir": str(tmp_path / "out"), "deployment": "disaggregated",
        "orchestrator": {"env": [{"id": "reverse-text", "model_rewards": [term]}]}, **more,
    }  # fmt: skip
    return validate_config(RLConfig, data)


def scorer_devices(tmp_path: Path, config: RLConfig, visible: list[str]) -> tuple[str, str]:
    """(the orchestrator's CUDA_VISIBLE_DEVICES, its reward model's scorer process's), both
    read in a real orchestrator-role process started the way the supervisor starts it: the
    scorer's environment is computed there, from what the orchestrator received."""
    spec = role_specs(
        config, write_role_configs(config, tmp_path), tmp_path, gpus=gpu_placement(config, visible)
    )["orch"]
    shown = tmp_path / "seen-scorer"
    program = (
        "import json, os, sys;"
        "from asyncrl.config.model_rewards import RewardModelTermConfig;"
        "from asyncrl.envs.model_rewards.scorer_process import scorer_environment;"
        "term = RewardModelTermConfig.model_validate_json(sys.argv[1]);"
        "env = scorer_environment(term, os.environ);"
        f"open({str(shown)!r}, 'w').write(json.dumps(["
        "os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>'),"
        "env.get('CUDA_VISIBLE_DEVICES', '<unset>')]))"
    )
    term = config.orchestrator.env[0].model_rewards[0]
    command = [sys.executable, "-c", program, term.model_dump_json()]
    child = RoleSpec("orch", command, [], spec.log, spec.heartbeat, spec.env)
    SupervisedRole(child, RestartConfig()).process.wait(timeout=60)
    orchestrator, scorer = json.loads(shown.read_text())
    return orchestrator, scorer


def test_a_reward_model_on_cuda_gets_the_servers_gpu_while_the_orchestrator_sees_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 60 (7): the orchestrator got CUDA_VISIBLE_DEVICES="" and its scorer inherited it,
    so `device: cuda` found no GPU under `asyncrl rl`."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = with_reward_model(tmp_path)
    assert scorer_devices(tmp_path, config, ["0", "1"]) == ("", "0")  # the server's GPU
    assert scorer_devices(tmp_path, config, ["4", "5", "6"]) == ("", "4,5")
    chosen = with_reward_model(tmp_path, "cuda:1", gpu_ids={"reward_model": [1, 0]})
    assert scorer_devices(tmp_path, chosen, ["0", "1"]) == ("", "1,0")


def test_a_reward_model_on_the_cpu_keeps_the_orchestrators_no_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = with_reward_model(tmp_path, "cpu")
    assert scorer_devices(tmp_path, config, ["0", "1"]) == ("", "")
    assert "reward_model" not in gpu_placement(config, ["0", "1"]).roles


@pytest.mark.parametrize(
    ("device", "visible", "more", "message"),
    [
        ("cuda", [], {}, "`rm` asks for device cuda, but this machine shows no CUDA device"),
        ("cuda:1", ["0", "1"], {}, "device cuda:1, but its process sees 1 GPU(s)"),
        ("cuda", ["0", "1"], {"gpu_ids": {"reward_model": [2]}}, "gpu_ids.reward_model: [2]"),
    ],
)
def test_a_reward_model_device_that_cannot_be_given_is_refused_at_launch(
    tmp_path: Path, device: str, visible: list[str], more: dict[str, object], message: str
) -> None:
    with pytest.raises(GPUPlacementError, match=re.escape(message)):
        gpu_placement(with_reward_model(tmp_path, device, **more), visible)


def test_a_reward_model_on_cuda_under_ray_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="on Ray the orchestrator, whose processes run reward"):
        with_reward_model(tmp_path, launcher="ray", deployment="disaggregated")
