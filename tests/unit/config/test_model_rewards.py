"""`env[].model_rewards`: each kind of model term, and the errors that name what is wrong."""

from __future__ import annotations

import pytest

from asyncrl.cli import COMMANDS
from asyncrl.config.base import ConfigError
from asyncrl.config.loading import validate_config
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.rl import RLConfig


def orchestrator(*terms: dict[str, object]) -> OrchestratorConfig:
    data = {"model": {"name": "m"}, "env": [{"id": "reverse-text", "model_rewards": list(terms)}]}
    return validate_config(OrchestratorConfig, data)


def test_each_kind_of_model_term_loads_with_its_defaults() -> None:
    config = orchestrator(
        {"type": "reward_model", "model": "rm"},
        {"type": "judge", "base_url": "http://127.0.0.1:9/v1", "weight": 0.5},
        {"type": "plugin", "name": "mine", "import_path": "my_scorer:load"},
    )
    reward_model, judge, plugin = config.env[0].model_rewards
    assert (reward_model.name, reward_model.weight, reward_model.label) == (
        "reward_model",
        1.0,
        None,
    )
    assert (judge.name, judge.weight, judge.read, judge.answer_tokens()) == (
        "judge",
        0.5,
        "number",
        16,
    )
    assert (plugin.name, plugin.import_path) == ("mine", "my_scorer:load")


@pytest.mark.parametrize(
    ("term", "message"),
    [
        ({"type": "judge"}, "has no `base_url`"),
        ({"type": "judge", "base_url": "u", "prompt": "{task} {reference}"}, "uses ['reference']"),
        ({"type": "judge", "base_url": "u", "prompt": "{task"}, "not a format string"),
        ({"type": "judge", "base_url": "u", "number_pattern": "("}, "not a regular expression"),
        ({"type": "judge", "base_url": "u", "scale": [5, 5]}, "high > low"),
        ({"type": "plugin", "import_path": "no_colon"}, "`module:factory`"),
        ({"type": "reward_model"}, "model_rewards[0].model`: required"),
        ({"type": "reward_model", "model": "rm", "device": "cuda:x"}, "`cuda` or `cuda:N`"),
        ({"type": "oracle"}, "does not match any of the expected tags"),
    ],
)
def test_a_bad_model_term_names_its_key_and_reason(term: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        orchestrator(term)
    assert message in str(error.value)
    assert "`env[0].model_rewards[0]" in str(error.value)


def rl(**extra: object) -> dict[str, object]:
    judge_term = {"type": "judge", "name": "j", "read": "verdict"}
    return {
        "model": "m", "inference": {"port": 8500}, "trainer": {},
        "orchestrator": {"env": [{"id": "reverse-text", "model_rewards": [judge_term]}],
                         "eval": {"env": [{"id": "arithmetic", "model_rewards": [judge_term]}]}},
        **extra,
    }  # fmt: skip


def test_rl_points_judges_without_an_endpoint_at_the_run_s_judge_server() -> None:
    config = validate_config(RLConfig, rl(judge={"model": "judge-model"}))
    assert config.judge is not None
    assert (config.judge.port, config.judge.host) == (8501, "127.0.0.1")
    assert config.judge.api_key_var == config.inference.api_key_var
    assert config.orchestrator.eval is not None
    for env in (config.orchestrator.env[0], config.orchestrator.eval.env[0]):
        (term,) = env.model_rewards
        assert term.type == "judge"
        assert (term.base_url, term.model) == ("http://127.0.0.1:8501/v1", "judge-model")
        assert term.api_key_var == config.inference.api_key_var


def test_rl_without_a_judge_section_refuses_a_judge_without_an_endpoint() -> None:
    with pytest.raises(ConfigError, match="has no `base_url`"):
        validate_config(RLConfig, rl())


def test_the_judge_server_may_not_take_the_inference_server_s_port() -> None:
    with pytest.raises(ConfigError, match=r"judge\.port"):
        validate_config(RLConfig, rl(judge={"model": "j", "port": 8500}))


def test_the_ray_launcher_refuses_to_start_a_judge_and_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match="start the judge server yourself"):
        validate_config(RLConfig, rl(judge={"model": "j"}, launcher="ray"))


@pytest.mark.parametrize(
    ("command", "config", "reason"),
    [
        ("eval", {"model": "m"}, "`asyncrl eval` scores with the environment's own rubric"),
        ("sft", {"model": "m"}, "`asyncrl sft` evaluates with the environment's own rubric"),
        ("env-server", {}, "whose `address` is this server"),
    ],
)
def test_commands_that_score_in_their_own_process_refuse_model_terms(
    command: str, config: dict[str, object], reason: str
) -> None:
    env = {"id": "reverse-text", "model_rewards": [{"type": "reward_model", "model": "rm"}]}
    with pytest.raises(ConfigError, match="are scored by the orchestrator") as error:
        validate_config(COMMANDS[command].config, {**config, "env": env})
    assert reason in str(error.value) and "`env`" in str(error.value)
