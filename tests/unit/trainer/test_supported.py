"""Trainer keys whose feature is not built, or that contradict each other, stop loading the
config (so `asyncrl rl` refuses them before it starts any process)."""

from __future__ import annotations

import re

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.loading import load_config
from asyncrl.config.trainer import TrainerConfig


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["--loss.teacher_tau", "0.1"], "teacher"),
        (["--loss.beta", "0.1"], "masked_is, which uses `kl_tau`"),
        (["--weight_broadcast.type", "nccl", "--lora", "true"], "with LoRA use `filesystem`"),
        (["--sync_ref_model", "--lora", "true", "--loss.type", "grpo_clip"], "sync_ref_model"),
    ],
)
def test_unbuilt_or_contradictory_settings_are_refused(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(TrainerConfig, [], ["--model", "m", *overrides])


def test_gpus_and_world_size_are_one_setting() -> None:
    for key in ("--gpus", "--world_size"):
        config = load_config(TrainerConfig, [], ["--model", "m", key, "4"])
        assert config.world_size == 4
    with pytest.raises(ConfigError, match=r"`gpus` \(2\) disagrees with `world_size` \(4\)"):
        load_config(TrainerConfig, [], ["--model", "m", "--gpus", "2", "--world_size", "4"])


def test_nccl_weight_broadcast_from_several_ranks_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="`world_size` > 1 is not built yet"):
        load_config(TrainerConfig, [], ["--model", "m", "--world_size", "2", "--lora", "false",
                                        "--weight_broadcast.type", "nccl"])  # fmt: skip


def test_asyncrl_rl_refuses_a_contradiction_before_starting_anything() -> None:
    from asyncrl.config.rl import RLConfig

    with pytest.raises(ConfigError, match=r"`trainer.loss`: .*masked_is, which uses `kl_tau`"):
        load_config(RLConfig, [], ["--model", "m", "--trainer.loss.beta", "0.1"])
    schedule = "{type: linear, start_temperature: 1, end_temperature: 0.5}"
    with pytest.raises(ConfigError, match=r"`sampling\.temp_scheduler` needs `max_steps`"):
        load_config(RLConfig, [], ["--model", "m", "--orchestrator.sampling.temp_scheduler",
                                   schedule])  # fmt: skip


def test_gspo_clips_its_sequence_ratio_at_the_papers_range_unless_told() -> None:
    from asyncrl.config.trainer import LossConfig

    gspo = LossConfig(type="gspo")
    assert (gspo.epsilon, gspo.epsilon_high) == (3e-4, 4e-4)
    assert LossConfig(type="gspo", epsilon=0.01).epsilon == 0.01
    assert (LossConfig(type="grpo_clip").epsilon, LossConfig().epsilon_high) == (0.2, None)


def test_k1_as_a_loss_term_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from asyncrl.config.trainer import LossConfig

    with caplog.at_level("WARNING", logger="asyncrl.config.trainer"):
        LossConfig(type="grpo_clip", beta=0.1, kl_estimator="k3")
        assert not caplog.records
        LossConfig(type="grpo_clip", beta=0.1, kl_estimator="k1")
    assert "gradient of zero in expectation" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["--loss.type", "grpo_clip", "--loss.kl_tau", "0.1"],
         "`kl_tau` does nothing for loss `grpo_clip`: it is read by masked_is"),
        (["--loss.epsilon", "0.3"], "`epsilon` does nothing for loss `masked_is`"),
        (["--loss.type", "dapo", "--loss.dr_grpo_length", "longest"],
         "`dr_grpo_length` does nothing for loss `dapo`: it is read by dr_grpo"),
    ],
)  # fmt: skip
def test_a_loss_key_the_chosen_loss_does_not_read_is_refused(
    overrides: list[str], says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(TrainerConfig, [], ["--model", "m", *overrides])


def test_a_loss_key_of_another_loss_at_its_default_loads() -> None:
    """A shared file may spell out every loss key at its default; only a value that would
    change nothing for this loss is refused."""
    overrides = ["--loss.type", "grpo_clip", "--loss.kl_tau", "0.0", "--loss.epsilon", "0.3"]
    config = load_config(TrainerConfig, [], ["--model", "m", *overrides])
    assert config.loss.epsilon == 0.3
