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


def test_several_updates_per_batch_via_accumulation_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="`gradient_accumulation_steps` is not supported yet"):
        load_config(TrainerConfig, [], ["--model", "m", "--gradient_accumulation_steps", "4"])
