"""`rl` copies the shared fields down to the roles and refuses any disagreement."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.loading import load_config
from asyncrl.config.rl import RLConfig
from asyncrl.launch.local import role_python


def rl(*overrides: str) -> RLConfig:
    return load_config(RLConfig, [], list(overrides))


def test_shared_fields_are_copied_to_every_role() -> None:
    config = rl("--model", "m", "--seq_len", "512", "--max_steps", "20", "--max_async_level", "2")
    assert config.inference.model == config.orchestrator.model.name == config.trainer.model == "m"
    assert config.orchestrator.seq_len == config.trainer.sequence_len == 512
    assert config.orchestrator.max_steps == config.trainer.max_steps == 20
    assert config.orchestrator.max_async_level == config.trainer.max_async_level == 2
    assert config.inference.max_model_len == 512  # inference holds a whole sample


def test_output_dir_is_the_trainer_dir_and_the_run_dir_is_its_run_child() -> None:
    config = rl("--model", "m", "--output_dir", "out/exp")
    assert config.trainer.output_dir == "out/exp"
    assert Path(config.orchestrator.output_dir) == Path("out/exp/run_default")
    assert config.trainer.run_name == "default"


def test_the_trainer_is_told_the_run_the_orchestrator_writes() -> None:
    config = rl("--model", "m", "--output_dir", "out", "--orchestrator.output_dir", "out/run_b")
    assert config.trainer.run_name == "b"
    named = rl("--model", "m", "--output_dir", "out", "--trainer.run_name", "c")
    assert Path(named.orchestrator.output_dir) == Path("out/run_c")


def test_a_value_set_in_one_role_only_reaches_the_others() -> None:
    config = rl("--trainer.model", "m", "--orchestrator.seq_len", "256")
    assert config.inference.model == config.orchestrator.model.name == "m"
    assert config.trainer.sequence_len == 256


def test_repeating_the_shared_value_in_a_role_is_fine() -> None:
    config = rl(
        "--model", "m", "--trainer.model", "m", "--max_steps", "5", "--trainer.max_steps", "5"
    )
    assert config.trainer.max_steps == 5


def test_no_step_limit_is_null_in_every_role_and_the_seeds_minus_one_reads_as_null() -> None:
    config = rl("--model", "m", "--trainer.max_steps", "-1")
    assert config.max_steps is config.orchestrator.max_steps is config.trainer.max_steps is None
    assert rl("--model", "m", "--max_steps", "-1").trainer.max_steps is None
    assert rl("--model", "m").trainer.max_steps is None


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["--model", "m", "--trainer.model", "other"], ["`trainer.model`", "`model`"]),
        (
            ["--inference.model", "a", "--orchestrator.model.name", "b"],
            ["`orchestrator.model.name`", "`inference.model`"],
        ),
        (
            ["--model", "m", "--orchestrator.seq_len", "256", "--trainer.sequence_len", "512"],
            ["`trainer.sequence_len`", "`orchestrator.seq_len`"],
        ),
        (
            [
                "--model",
                "m",
                "--orchestrator.max_async_level",
                "1",
                "--trainer.max_async_level",
                "3",
            ],
            ["`trainer.max_async_level`", "`orchestrator.max_async_level`"],
        ),
        (
            ["--model", "m", "--orchestrator.max_steps", "10", "--trainer.max_steps", "-1"],
            ["`trainer.max_steps`", "`orchestrator.max_steps`"],
        ),
        (
            ["--model", "m", "--output_dir", "a", "--trainer.output_dir", "b"],
            ["`trainer.output_dir`", "`output_dir`"],
        ),
        (
            ["--model", "m", "--output_dir", "a", "--orchestrator.output_dir", "b/run_x"],
            ["`orchestrator.output_dir`", "`run_*`"],
        ),
        (
            [
                "--model",
                "m",
                "--output_dir",
                "a",
                "--orchestrator.output_dir",
                "a/run_x",
                "--trainer.run_name",
                "y",
            ],
            ["`trainer.run_name`", "`orchestrator.output_dir`"],
        ),
        (
            ["--model", "m", "--seq_len", "1024", "--inference.max_model_len", "512"],
            ["`inference.max_model_len`", "`seq_len`"],
        ),
    ],
)
def test_disagreeing_roles_stop_start_up_naming_both_keys(
    overrides: list[str], named: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        rl(*overrides)
    for key in named:
        assert key in str(caught.value)


def test_errors_inside_a_role_carry_the_role_prefix() -> None:
    with pytest.raises(ConfigError, match=r"`trainer\.loss\.kl_tau`"):
        rl("--model", "m", "--trainer.loss.kl_tau", "-1")


def test_roles_are_connected_to_each_other() -> None:
    config = rl("--model", "m", "--inference.port", "8123", "--output_dir", "runs/a",
                "--orchestrator.rollout_transport", "{type: zmq, port: 5600}")  # fmt: skip
    assert config.orchestrator.client.base_url == ["http://127.0.0.1:8123/v1"]
    assert config.inference.weight_roots == ["runs/a"]
    assert config.trainer.rollout_transport.type == "zmq"
    assert config.trainer.rollout_transport.port == 5600


def test_nccl_broadcast_on_the_trainer_switches_the_server_to_receive_it() -> None:
    config = rl(
        "--model", "m", "--trainer.lora", "false",
        "--trainer.weight_broadcast", "{type: nccl, port: 29600}",
    )  # fmt: skip
    assert config.inference.weight_broadcast_type == "nccl"
    assert config.inference.weight_broadcast_port == 29600


def test_the_trainer_checksums_and_makes_deltas_at_the_servers_dtype() -> None:
    assert rl("--model", "m").trainer.weight_broadcast.served_dtype == "auto"
    config = rl("--model", "m", "--inference.dtype", "bfloat16", "--weight_broadcast.delta", "on")
    assert config.trainer.weight_broadcast.served_dtype == "bfloat16"
    assert config.trainer.weight_broadcast.delta == "on"
    chosen = rl("--model", "m", "--inference.dtype", "bfloat16",
                "--weight_broadcast.served_dtype", "float32")  # fmt: skip
    assert chosen.trainer.weight_broadcast.served_dtype == "float32"


def test_colocated_deployment_hands_the_inference_section_to_the_trainer() -> None:
    config = rl("--model", "m", "--deployment", "colocated", "--inference.port", "8124",
                "--inference.max_num_seqs", "16")  # fmt: skip
    served = config.trainer.colocated_inference
    assert served is not None
    assert (served.model, served.port, served.max_num_seqs) == ("m", 8124, 16)
    assert config.orchestrator.client.base_url == ["http://127.0.0.1:8124/v1"]
    assert rl("--model", "m").trainer.colocated_inference is None  # disaggregated by default


def test_colocated_is_on_policy_unless_told_otherwise() -> None:
    assert rl("--model", "m", "--deployment", "colocated").max_async_level == 0
    assert rl("--model", "m").orchestrator.max_async_level == 1
    told = rl("--model", "m", "--deployment", "colocated", "--trainer.max_async_level", "2")
    assert told.orchestrator.max_async_level == told.trainer.max_async_level == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--launcher", "ray"], "launcher: local"),
        (["--inference.backend", "sglang"], "SGLang's is not built in"),
        (["--inference.backend", "vllm", "--inference.tp", "2"], "must be 1"),
        (["--trainer.world_size", "2"], "shares one device"),
        (["--trainer.lora", "false", "--trainer.weight_broadcast", "{type: nccl}"],
         "syncs weights in memory"),
    ],
)  # fmt: skip
def test_colocated_refuses_what_it_cannot_do(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        rl("--model", "m", "--deployment", "colocated", *overrides)


def test_with_restarts_on_a_restarted_role_has_checkpoints_to_resume_from() -> None:
    config = rl("--model", "m")
    assert config.restart.max_restarts == 3
    assert config.orchestrator.ckpt.interval == 1 and config.trainer.save_steps == 25
    assert config.orchestrator.ckpt.keep_last == config.trainer.keep_last == 2


def test_checkpoint_intervals_the_user_set_or_restarts_off_are_left_alone() -> None:
    assert rl("--model", "m", "--orchestrator.ckpt.interval", "5").trainer.save_steps == 5
    config = rl("--model", "m", "--restart.max_restarts", "0")
    assert config.orchestrator.ckpt.interval is None and config.trainer.save_steps is None


def test_roles_that_cannot_restart_get_no_default_checkpoints() -> None:
    """With zmq batches neither orchestrator nor trainer can restart alone."""
    config = rl("--model", "m", "--orchestrator.rollout_transport.type", "zmq")
    assert config.orchestrator.ckpt.interval is None and config.trainer.save_steps is None


def test_a_hang_timeout_shorter_than_two_heartbeats_is_refused_by_its_path() -> None:
    with pytest.raises(ConfigError, match=r"restart\.hang_timeout"):
        rl("--model", "m", "--restart.hang_timeout", "1")


def test_a_colocated_vllm_trainer_runs_under_vllms_interpreter() -> None:
    """vLLM's engine lives in the trainer's process, so the trainer starts from vLLM's venv;
    the other roles, and every role otherwise, from this interpreter."""
    vllm = ["--inference.backend", "vllm", "--inference.executable", "/opt/vllm/bin/python"]
    colocated = rl("--model", "m", "--deployment", "colocated", *vllm)
    assert colocated.trainer.colocated_inference is not None
    assert colocated.trainer.colocated_inference.backend == "vllm"
    assert role_python("train", colocated) == "/opt/vllm/bin/python"
    assert role_python("orch", colocated) == sys.executable
    assert role_python("train", rl("--model", "m", *vllm)) == sys.executable  # disaggregated


def test_the_shared_sections_reach_every_role_under_its_own_names() -> None:
    config = rl(
        "--model", "m", "--checkpoint.interval", "4", "--checkpoint.keep_last", "3",
        "--checkpoint.resume_step", "-1", "--rollout_transport.type", "zmq",
        "--rollout_transport.port", "6001", "--weight_broadcast.type", "nccl",
        "--weight_broadcast.port", "29777", "--weight_broadcast.timeout", "30",
        "--trainer.lora", "false",
    )  # fmt: skip
    orchestrator, trainer, inference = config.orchestrator, config.trainer, config.inference
    assert orchestrator.ckpt.interval == trainer.save_steps == config.checkpoint.interval == 4
    assert orchestrator.ckpt.keep_last == trainer.keep_last == 3
    assert orchestrator.ckpt.resume_step == trainer.resume_step == -1
    assert orchestrator.rollout_transport == trainer.rollout_transport == config.rollout_transport
    assert trainer.rollout_transport.port == 6001
    assert trainer.weight_broadcast.type == inference.weight_broadcast_type == "nccl"
    assert trainer.weight_broadcast.port == inference.weight_broadcast_port == 29777
    assert trainer.weight_broadcast.timeout == inference.weight_broadcast_timeout == 30


def test_a_role_key_for_a_shared_setting_sets_it_for_the_run() -> None:
    """A role's own name for a shared setting (a role's file, the seeds' layout) still works."""
    config = rl(
        "--model", "m", "--trainer.weight_broadcast.type", "nccl", "--trainer.lora", "false"
    )
    assert config.weight_broadcast.type == config.inference.weight_broadcast_type == "nccl"
    config = rl("--model", "m", "--orchestrator.rollout_transport.type", "zmq")
    assert config.trainer.rollout_transport.type == config.rollout_transport.type == "zmq"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["--checkpoint.interval", "4", "--trainer.save_steps", "5"],
         ["`trainer.save_steps`", "`checkpoint.interval`"]),
        (["--orchestrator.ckpt.interval", "2", "--trainer.save_steps", "3"],
         ["`trainer.save_steps`", "`orchestrator.ckpt.interval`"]),
        (["--weight_broadcast.type", "nccl", "--inference.weight_broadcast_type", "filesystem"],
         ["`inference.weight_broadcast_type`", "`weight_broadcast.type`"]),
    ],
)  # fmt: skip
def test_two_names_of_one_shared_setting_must_agree(overrides: list[str], named: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        rl("--model", "m", *overrides)
    for key in named:
        assert key in str(caught.value)


def test_the_orchestrator_may_checkpoint_apart_from_the_trainer() -> None:
    config = rl(
        "--model", "m", "--checkpoint.interval", "10", "--checkpoint.orchestrator_interval", "1"
    )  # fmt: skip
    assert config.trainer.save_steps == 10 and config.orchestrator.ckpt.interval == 1
    config = rl("--model", "m", "--checkpoint.orchestrator_interval", "2")  # restarts on
    assert config.orchestrator.ckpt.interval == 2 and config.trainer.save_steps == 25
