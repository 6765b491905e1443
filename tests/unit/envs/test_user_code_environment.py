"""What a process running a user's code starts with (issue 60, items 4 and 7): the
orchestrator's environment less the run's secret and every key it holds, and for a reward
model on `cuda` the GPUs set aside for it. Pure over plain mappings; the real processes are
`tests/integration/envs/test_secrets_withheld.py` and `tests/unit/launch/test_gpu_placement.py`."""

from __future__ import annotations

import pytest

from asyncrl import run_secret
from asyncrl.config.model_rewards import PluginTermConfig, RewardModelTermConfig
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs.model_rewards.scorer_process import scorer_environment
from asyncrl.run_secret import user_code_environment, withhold

ORCHESTRATOR = {
    "PATH": "/usr/bin",
    "HF_TOKEN": "the user's own, for gated models",
    "ASYNCRL_RUN_SECRET": "run-secret-0123456789",
    "VLLM_API_KEY": "inference-key",
    "ASYNCRL_ENV_API_KEY": "env-server-key",
    "RAY_AUTH_TOKEN": "ray-token",
    "CUDA_VISIBLE_DEVICES": "",
    "ASYNCRL_SCORER_DEVICES": "0,1",
}


@pytest.fixture(autouse=True)
def fresh_withheld(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_secret, "_withheld", set(run_secret.ALWAYS_WITHHELD))


def test_the_run_secret_and_the_default_keys_are_always_withheld() -> None:
    seen = user_code_environment(ORCHESTRATOR)
    assert seen == {
        "PATH": "/usr/bin",
        "HF_TOKEN": "the user's own, for gated models",
        "CUDA_VISIBLE_DEVICES": "",
        "ASYNCRL_SCORER_DEVICES": "0,1",
    }


def test_the_variables_a_config_names_for_its_keys_are_withheld_too() -> None:
    config = OrchestratorConfig.model_validate({
        "model": {"name": "m"},
        "client": {"api_key_var": "MY_INFERENCE_KEY"},
        "env": [
            {"id": "reverse-text", "address": "http://10.0.0.9:8100", "api_key_var": "ENV_KEY",
             "model_rewards": [{"type": "judge", "base_url": "https://api.example/v1",
                                "api_key_var": "OPENAI_API_KEY"}]},
        ],
        "eval": {"env": [{"id": "reverse-text", "address": "http://10.0.0.9:8101",
                          "api_key_var": "EVAL_ENV_KEY"}]},
    })  # fmt: skip
    assert set(config.secret_variables()) == {
        "MY_INFERENCE_KEY", "ENV_KEY", "OPENAI_API_KEY", "EVAL_ENV_KEY",
    }  # fmt: skip
    withhold(*config.secret_variables())
    keys = {name: "k" for name in config.secret_variables()}
    assert user_code_environment({**keys, "PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}


def test_a_reward_model_on_cuda_sees_the_gpus_set_aside_for_it() -> None:
    on_gpu = scorer_environment(RewardModelTermConfig(model="rm", device="cuda:1"), ORCHESTRATOR)
    assert on_gpu["CUDA_VISIBLE_DEVICES"] == "0,1" and "ASYNCRL_SCORER_DEVICES" not in on_gpu
    assert not set(run_secret.ALWAYS_WITHHELD) & set(on_gpu)
    on_cpu = scorer_environment(RewardModelTermConfig(model="rm", threads=3), ORCHESTRATOR)
    assert on_cpu["CUDA_VISIBLE_DEVICES"] == "" and on_cpu["OMP_NUM_THREADS"] == "3"
    plugin = scorer_environment(PluginTermConfig(import_path="m:f"), ORCHESTRATOR)
    assert plugin["CUDA_VISIBLE_DEVICES"] == "" and "ASYNCRL_SCORER_DEVICES" not in plugin


def test_an_orchestrator_started_by_hand_gives_its_reward_model_its_own_devices() -> None:
    """Without `asyncrl rl`'s variable, the scorer sees what the orchestrator was given."""
    by_hand = {"CUDA_VISIBLE_DEVICES": "3", "PATH": "/usr/bin"}
    seen = scorer_environment(RewardModelTermConfig(model="rm", device="cuda"), by_hand)
    assert seen["CUDA_VISIBLE_DEVICES"] == "3"
