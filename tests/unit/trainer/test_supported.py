"""Trainer keys that are accepted by the config but whose feature is not built stop start-up."""

from __future__ import annotations

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.loading import load_config
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.train import check_supported


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["--loss.teacher_tau", "0.1"], "teacher"),
        (["--loss.beta", "0.1"], "masked_is uses `loss.kl_tau`"),
        (["--weight_broadcast.type", "nccl", "--lora", "true"], "with LoRA use `filesystem`"),
        (["--sync_ref_model", "--lora", "true", "--loss.type", "grpo_clip"], "sync_ref_model"),
    ],
)
def test_unbuilt_or_contradictory_settings_are_refused(overrides: list[str], says: str) -> None:
    config = load_config(TrainerConfig, [], ["--model", "m", *overrides])
    with pytest.raises(ConfigError, match=says):
        check_supported(config)


def test_gpus_and_world_size_are_one_setting() -> None:
    for key in ("--gpus", "--world_size"):
        config = load_config(TrainerConfig, [], ["--model", "m", key, "4"])
        assert config.world_size == config.gpus == 4
    with pytest.raises(ConfigError, match=r"`gpus` \(2\) and `world_size` \(4\) disagree"):
        load_config(TrainerConfig, [], ["--model", "m", "--gpus", "2", "--world_size", "4"])


def test_nccl_weight_broadcast_from_several_ranks_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="`world_size` > 1 is not built yet"):
        load_config(TrainerConfig, [], ["--model", "m", "--world_size", "2",
                                        "--weight_broadcast.type", "nccl"])  # fmt: skip
