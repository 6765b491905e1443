"""Every kind of config error stops start-up naming the key path, the value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.inference import InferenceConfig
from asyncrl.config.loading import load_config
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.rl import RLConfig
from asyncrl.config.trainer import TrainerConfig


def error_of(model: type, overrides: list[str], files: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(model, files or [], overrides)
    return str(caught.value)


def test_unknown_key_names_its_full_path_and_suggests_the_close_one() -> None:
    message = error_of(RLConfig, ["--model", "m", "--trainer.loss.kl_ta", "0.1"])
    assert "`trainer.loss.kl_ta`: unknown key" in message
    assert "did you mean `trainer.loss.kl_tau`?" in message


def test_unknown_key_inside_a_list_item_names_the_index() -> None:
    message = error_of(OrchestratorConfig, ["--filters", "[{type: repetition, windw: 3}]"])
    assert "`filters[0].windw`: unknown key; did you mean `filters[0].window`?" in message


def test_wrong_type_names_path_value_and_expected_type() -> None:
    message = error_of(TrainerConfig, ["--model", "m", "--loss.kl_tau", "lots"])
    assert "`loss.kl_tau`" in message
    assert "'lots'" in message
    assert "valid number" in message


def test_out_of_range_value_says_what_is_allowed() -> None:
    message = error_of(InferenceConfig, ["--model", "m", "--port", "70000"])
    assert "`port`" in message and "70000" in message and "less than or equal to 65535" in message


def test_value_outside_a_choice_lists_the_choices() -> None:
    message = error_of(TrainerConfig, ["--model", "m", "--loss.type", "ppo"])
    assert "`loss.type`" in message
    assert "'masked_is'" in message and "'cispo'" in message


def test_missing_required_key_is_named() -> None:
    assert "`model`: required, not set" in error_of(InferenceConfig, [])


def test_cross_field_rule_names_both_fields() -> None:
    message = error_of(
        OrchestratorConfig,
        ["--model.name", "m", "--batch_size", "10", "--rollouts_per_example", "4"],
    )
    assert "`batch_size` (10) must be a multiple of `rollouts_per_example` (4)" in message


def test_every_error_is_reported_not_only_the_first() -> None:
    message = error_of(TrainerConfig, ["--model", "m", "--learning_rate", "-1", "--lora_rank", "0"])
    assert "`learning_rate`" in message and "`lora_rank`" in message


def test_planned_key_set_away_from_default_is_refused_not_ignored() -> None:
    message = error_of(TrainerConfig, ["--model", "m", "--loss.teacher_tau", "0.5"])
    assert "`loss.teacher_tau` is not supported yet (teacher logprobs)" in message
    load_config(TrainerConfig, [], ["--model", "m", "--loss.teacher_tau", "0"])  # the default


def test_parallelism_needs_an_engine_that_has_it() -> None:
    message = error_of(InferenceConfig, ["--model", "m", "--tp", "2"])
    assert "`tp`/`dp` (2/1) need `backend: vllm` or `sglang`" in message
    load_config(InferenceConfig, [], ["--model", "m", "--tp", "2", "--backend", "vllm"])


def test_nccl_weight_broadcast_is_refused_for_vllm() -> None:
    overrides = ["--model", "m", "--backend", "vllm", "--weight_broadcast_type", "nccl"]
    assert "built for the embedded engine only" in error_of(InferenceConfig, overrides)


def test_a_wrong_key_inside_a_list_item_names_the_index() -> None:
    message = error_of(
        OrchestratorConfig, ["--model.name", "m", "--env", "[{id: a}, {id: b, adress: 'h:1'}]"]
    )
    assert "`env[1].adress`: unknown key; did you mean `env[1].address`?" in message


def test_unparsable_file_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    message = error_of(TrainerConfig, [], [str(broken)])
    assert str(broken) in message and "not valid YAML" in message


def test_file_whose_top_level_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    listing_yaml = tmp_path / "list.yaml"
    listing_yaml.write_text("- a\n- b\n")
    assert "top level must be a mapping" in error_of(TrainerConfig, [], [str(listing_yaml)])


def test_missing_file_and_wrong_suffix_are_named(tmp_path: Path) -> None:
    assert "cannot read config file" in error_of(TrainerConfig, [], [str(tmp_path / "no.yaml")])
    assert "must end in" in error_of(TrainerConfig, [], [str(tmp_path / "config.json")])
