from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.loading import deep_merge, load_config, parse_overrides
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.trainer import TrainerConfig


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_yaml_file_sets_nested_fields(tmp_path: Path) -> None:
    config_file = write(
        tmp_path / "train.yaml",
        "model: ./reverse-fft\nlearning_rate: 3e-6\n"
        "loss:\n  kl_tau: 0.05\n  ratio_type: sequence\n",
    )
    config = load_config(TrainerConfig, [config_file])
    assert config.model == "./reverse-fft"
    assert config.learning_rate == pytest.approx(3e-6)  # YAML reads 3e-6 as a string; coerced
    assert config.loss.kl_tau == 0.05
    assert config.loss.ratio_type == "sequence"
    assert config.loss.adv_tau == 1.0  # untouched default


def test_toml_file_loads_like_yaml(tmp_path: Path) -> None:
    config_file = write(
        tmp_path / "orch.toml",
        'batch_size = 64\nrollouts_per_example = 16\n[model]\nname = "m"\n'
        '[[env]]\nid = "reverse-text"\n[sampling]\nmax_tokens = 128\n',
    )
    config = load_config(OrchestratorConfig, [config_file])
    assert (config.batch_size, config.rollouts_per_example) == (64, 16)
    assert config.model.name == "m"
    assert config.env[0].id == "reverse-text"
    assert config.sampling.max_tokens == 128


def test_files_merge_left_to_right_section_by_section(tmp_path: Path) -> None:
    first = write(tmp_path / "a.yaml", "model: a\nloss:\n  kl_tau: 0.1\n  adv_tau: 2.0\n")
    second = write(tmp_path / "b.toml", 'model = "b"\n[loss]\nkl_tau = 0.3\n')
    config = load_config(TrainerConfig, [first, second])
    assert config.model == "b"
    assert config.loss.kl_tau == 0.3
    assert config.loss.adv_tau == 2.0  # kept from the first file: sections merge, not replace


def test_command_line_overrides_beat_files(tmp_path: Path) -> None:
    base = write(tmp_path / "t.yaml", "model: a\nlearning_rate: 1e-5\nlora: true\n")
    config = load_config(
        TrainerConfig,
        [base],
        ["--loss.kl_tau", "0.01", "--learning_rate=2e-5", "--lora", "false"],
    )
    assert config.loss.kl_tau == 0.01
    assert config.learning_rate == pytest.approx(2e-5)
    assert config.lora is False


def test_bare_flag_means_true_and_lists_parse_as_yaml() -> None:
    overrides = parse_overrides(
        ["--lora", "--lora_target_modules", "[q_proj, v_proj]", "--max-steps", "5"]
    )
    assert overrides == {"lora": True, "lora_target_modules": ["q_proj", "v_proj"], "max_steps": 5}


def test_deep_merge_replaces_lists_whole() -> None:
    merged = deep_merge({"env": [{"id": "a"}, {"id": "b"}], "x": {"y": 1}}, {"env": [{"id": "c"}]})
    assert merged == {"env": [{"id": "c"}], "x": {"y": 1}}


def test_api_key_is_read_from_the_named_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = load_config(
        OrchestratorConfig, [], ["--model.name", "m", "--client.api_key_var", "MY_KEY"]
    )
    monkeypatch.delenv("MY_KEY", raising=False)
    assert config.client.api_key() is None
    monkeypatch.setenv("MY_KEY", "s3cret")
    assert config.client.api_key() == "s3cret"
    assert "s3cret" not in config.model_dump_json()  # the secret never sits in the config


def test_trainer_transport_type_is_an_alias_that_must_agree() -> None:
    config = load_config(TrainerConfig, [], ["--model", "m", "--transport_type", "zmq"])
    assert config.rollout_transport.type == "zmq"
    with pytest.raises(ConfigError, match=r"disagrees with `rollout_transport\.type`"):
        load_config(
            TrainerConfig, [],
            ["--model", "m", "--transport_type", "zmq", "--rollout_transport.type", "filesystem"],
        )  # fmt: skip
