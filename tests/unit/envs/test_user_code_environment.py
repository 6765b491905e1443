"""What a process running a user's code starts with (issue 60, items 4 and 7; issue 86, item 3):
one rule, an allowlist plus what the config passes through by name, never a key of the run;
the same for reward workers, scorers and the import check; and for a reward model on `cuda` the
GPUs set aside for it. Pure over plain mappings, except the import check, which is started for
real; the reward worker and scorer processes are `tests/integration/envs/test_secrets_withheld.py`
and `tests/unit/launch/test_gpu_placement.py`."""

from __future__ import annotations

import json

import pytest

from asyncrl import run_secret
from asyncrl.config.env_server import EnvServerConfig
from asyncrl.config.import_path import run_elsewhere
from asyncrl.config.model_rewards import PluginTermConfig, RewardModelTermConfig
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs.model_rewards.scorer_process import scorer_environment
from asyncrl.run_secret import withhold
from asyncrl.user_code import pass_through, user_code_environment

NEEDED = {  # what a program needs to run and import its packages
    "PATH": "/usr/bin",
    "HOME": "/home/u",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TMPDIR": "/tmp/u",
    "PYTHONPATH": "/home/u/rewards",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "HF_HOME": "/home/u/hf",
    "CUDA_VISIBLE_DEVICES": "",
}
CREDENTIALS = {  # what the issue saw reach a reward worker
    "HF_TOKEN": "hf_secret",
    "WANDB_API_KEY": "wandb-secret",
    "AWS_ACCESS_KEY_ID": "AKIA",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "OPENAI_API_KEY": "sk-secret",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent",
    "GITHUB_TOKEN": "ghp_secret",
    "MY_OWN_SETTING": "anything not named",
}
RUN_KEYS = {
    "ASYNCRL_RUN_SECRET": "run-secret-0123456789",
    "VLLM_API_KEY": "inference-key",
    "ASYNCRL_ENV_API_KEY": "env-server-key",
    "RAY_AUTH_TOKEN": "ray-token",
}
ORCHESTRATOR = {**NEEDED, **CREDENTIALS, **RUN_KEYS, "ASYNCRL_SCORER_DEVICES": "0,1"}


def test_user_code_gets_the_allowlist_and_nothing_else() -> None:
    assert user_code_environment(ORCHESTRATOR) == NEEDED


def test_a_variable_the_config_names_is_passed_but_never_a_key_of_the_run() -> None:
    pass_through("HF_TOKEN", "MY_OWN_SETTING", "VLLM_API_KEY")  # the last: refused by config
    seen = user_code_environment(ORCHESTRATOR)
    assert seen == {**NEEDED, "HF_TOKEN": "hf_secret", "MY_OWN_SETTING": "anything not named"}


def test_the_variables_a_config_names_for_its_keys_are_withheld_even_if_allowlisted() -> None:
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
    pass_through(*config.secret_variables())  # as a careless config would, were it allowed
    keys = {name: "k" for name in config.secret_variables()}
    assert user_code_environment({**keys, "PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}


@pytest.mark.parametrize(
    ("passed", "refused"),
    [(["ASYNCRL_RUN_SECRET"], "holds a key of the run"),
     (["MY_INFERENCE_KEY"], "holds a key of the run"),
     (["AWS_*"], "name each variable whole")],
)  # fmt: skip
def test_a_config_cannot_pass_a_key_of_the_run_or_a_pattern(passed: list[str], refused: str):
    with pytest.raises(ValueError, match=refused):
        OrchestratorConfig.model_validate({
            "model": {"name": "m"}, "client": {"api_key_var": "MY_INFERENCE_KEY"},
            "env": [{"id": "reverse-text"}], "reward_env_passthrough": passed,
        })  # fmt: skip
    with pytest.raises(ValueError, match=refused):
        EnvServerConfig.model_validate({
            "env": {"id": "reverse-text"}, "api_key_var": "MY_INFERENCE_KEY",
            "env_passthrough": passed,
        })  # fmt: skip


def test_the_import_check_runs_with_the_same_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the check stripped names that looked like secrets: `SSH_AUTH_SOCK` and
    `AWS_ACCESS_KEY_ID` passed, and a key named otherwise too."""
    for name, value in {**CREDENTIALS, **RUN_KEYS}.items():
        monkeypatch.setenv(name, value)
    pass_through("MY_OWN_SETTING")
    script = "import json, os; print(json.dumps(dict(os.environ)))"
    seen = json.loads(run_elsewhere(script, "m:f", "reward"))
    assert not (set(CREDENTIALS) - {"MY_OWN_SETTING"}) & set(seen)
    assert not set(RUN_KEYS) & set(seen)
    assert seen["MY_OWN_SETTING"] == "anything not named"
    assert set(seen) - set(user_code_environment()) <= {"LC_CTYPE"}  # Python's own locale fix


def test_a_reward_model_on_cuda_sees_the_gpus_set_aside_for_it() -> None:
    on_gpu = scorer_environment(RewardModelTermConfig(model="rm", device="cuda:1"), ORCHESTRATOR)
    assert on_gpu["CUDA_VISIBLE_DEVICES"] == "0,1" and "ASYNCRL_SCORER_DEVICES" not in on_gpu
    assert not set(run_secret.ALWAYS_WITHHELD) & set(on_gpu)
    assert not set(CREDENTIALS) & set(on_gpu)
    on_cpu = scorer_environment(RewardModelTermConfig(model="rm", threads=3), ORCHESTRATOR)
    assert on_cpu["CUDA_VISIBLE_DEVICES"] == "" and on_cpu["OMP_NUM_THREADS"] == "3"
    plugin = scorer_environment(PluginTermConfig(import_path="m:f"), ORCHESTRATOR)
    assert plugin["CUDA_VISIBLE_DEVICES"] == "" and "ASYNCRL_SCORER_DEVICES" not in plugin


def test_an_orchestrator_started_by_hand_gives_its_reward_model_its_own_devices() -> None:
    """Without `asyncrl rl`'s variable, the scorer sees what the orchestrator was given."""
    by_hand = {"CUDA_VISIBLE_DEVICES": "3", "PATH": "/usr/bin"}
    seen = scorer_environment(RewardModelTermConfig(model="rm", device="cuda"), by_hand)
    assert seen["CUDA_VISIBLE_DEVICES"] == "3"
