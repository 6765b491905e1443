"""Configs written for the seeds (Surogate's trainer and orchestrator files, prime-rl's names)
load: each seed name sets the asyncrl key the table says, a seed key with nothing to set here is
accepted at its seed default and refused otherwise with the key to use, and every seed name
stays out of asyncrl's own models (one name per setting in `--help` and the reference)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.help import iter_fields
from asyncrl.config.loading import load_config
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.rl import RLConfig
from asyncrl.config.seed_names import SEED_KEYS_WITHOUT_EFFECT, SEED_NAMES, apply_seed_names
from asyncrl.config.trainer import TrainerConfig
from asyncrl.config.transport import RolloutTransportConfig

SUROGATE_TRAINER = """\
model: "./reverse-fft"
output_dir: ./outputs
gpus: 1
sample_packing: false
datasets: []
per_device_train_batch_size: 1
sequence_len: 2048
max_steps: 20
logging_steps: 1
learning_rate: 3e-6
lr_scheduler_type: constant
warmup_steps: 0
max_grad_norm: 1.0
weight_decay: 0.01
optimizer: adamw
recipe: bf16
lora: false
loss:
  ratio_type: token
  kl_tau: 0.0
  adv_tau: 1.0
  token_mask_low: 0.125
  token_mask_high: 8.0
  geo_mask_low: 0.1
  geo_mask_high: 10.0
transport_type: zmq
max_async_level: 1
save_steps: 100
"""

SUROGATE_ORCHESTRATOR = """\
model:
  name: ./reverse-fft
batch_size: 128
rollouts_per_example: 16
max_steps: 20
max_async_level: 1
rollout_transport:
  type: zmq
weight_broadcast:
  type: filesystem
"""


def test_a_surogate_trainer_file_loads_with_its_names_set_on_asyncrl_keys(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(SUROGATE_TRAINER)
    config = load_config(TrainerConfig, [str(path)], [])
    assert config.world_size == 1
    assert config.rollout_transport.type == "zmq"  # from `transport_type`
    assert config.sequence_len == 2048 and config.save_steps == 100
    assert config.loss.token_mask_high == 8.0


def test_a_surogate_orchestrator_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "orch.yaml"
    path.write_text(SUROGATE_ORCHESTRATOR)
    config = load_config(OrchestratorConfig, [str(path)], [])
    assert config.rollout_transport.type == "zmq" and config.batch_size == 128


def test_seed_names_inside_an_rl_file_are_wired_like_asyncrl_names() -> None:
    config = load_config(
        RLConfig, [],
        ["--model", "m", "--deployment", "disaggregated", "--trainer.transport_type", "zmq",
         "--trainer.gpus", "2"],
    )  # fmt: skip
    assert config.trainer.rollout_transport.type == "zmq"
    assert config.trainer.world_size == 2


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["--gpus", "2", "--world_size", "4"], r"`gpus` \(2\) disagrees with `world_size` \(4\)"),
        (["--transport_type", "zmq", "--rollout_transport.type", "filesystem"],
         r"`transport_type` \(zmq\) disagrees with `rollout_transport.type` \(filesystem\)"),
        (["--datasets", "[{path: x}]"], "GRPO data comes from the orchestrator"),
    ],
)  # fmt: skip
def test_a_seed_name_that_contradicts_or_would_do_nothing_is_refused(
    overrides: list[str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(TrainerConfig, [], ["--model", "m", *overrides])


def test_an_orchestrator_weight_broadcast_other_than_the_seed_default_names_the_trainer_key() -> (
    None
):
    with pytest.raises(ConfigError, match=r"`trainer\.weight_broadcast`"):
        load_config(
            OrchestratorConfig, [], ["--model.name", "m", "--weight_broadcast.type", "nccl"]
        )


@pytest.mark.parametrize(
    ("section", "model"), [("trainer", TrainerConfig), ("orchestrator", OrchestratorConfig)]
)
def test_seed_names_are_not_fields_of_asyncrl_models(section: str, model: type) -> None:
    fields = {path for path, *_ in iter_fields(model)}
    seed_keys = {*SEED_NAMES.get(section, {}), *SEED_KEYS_WITHOUT_EFFECT.get(section, {})}
    assert not seed_keys & fields
    assert all(target in fields for target in SEED_NAMES.get(section, {}).values())


def test_a_seed_weight_broadcast_block_of_type_filesystem_loads_whatever_its_nccl_keys() -> None:
    """The seeds' block lists `host`, `port` and `timeout` beside `type`: under filesystem they
    do nothing there either, so a file that spells them out loads."""
    block = "{type: filesystem, host: localhost, port: 29501, timeout: 1200}"
    config = load_config(OrchestratorConfig, [], ["--model.name", "m", "--weight_broadcast", block])
    assert config.model.name == "m"
    with pytest.raises(ConfigError, match=r"`trainer\.weight_broadcast`"):
        load_config(
            OrchestratorConfig, [], ["--model.name", "m", "--weight_broadcast", "{type: nccl}"]
        )


def test_a_seed_name_disagreeing_with_a_section_given_as_a_model_is_refused() -> None:
    """Code that builds a config may hand a section as a model, not a dict: the agreement check
    reads it too."""
    section = {
        "transport_type": "zmq",
        "rollout_transport": RolloutTransportConfig(type="filesystem"),
    }
    with pytest.raises(ValueError, match=r"disagrees with `rollout_transport\.type`"):
        apply_seed_names("trainer", section)
