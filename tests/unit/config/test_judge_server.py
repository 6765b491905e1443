"""The `judge` section of `asyncrl rl`: the inference keys that mean something for a frozen
judge, the inference config the judge server starts with, and the keys it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.help import iter_fields
from asyncrl.config.inference import InferenceConfig
from asyncrl.config.judge_server import JUDGE_KEYS, POLICY_SERVER_KEYS, JudgeServerConfig
from asyncrl.config.loading import validate_config
from asyncrl.config.rl import RLConfig

JUDGES_PAGE = Path(__file__).resolve().parents[3] / "docs" / "judges.md"


def rl(judge: dict[str, object]) -> dict[str, object]:
    return {"model": "m", "inference": {"port": 8500}, "trainer": {}, "orchestrator": {},
            "judge": judge}  # fmt: skip


def test_judge_keys_are_the_inference_fields_themselves() -> None:
    """Type, default, bounds and description live in `InferenceConfig` only."""
    assert list(JudgeServerConfig.model_fields) == list(JUDGE_KEYS)
    for key, field in JudgeServerConfig.model_fields.items():
        source = InferenceConfig.model_fields[key]
        assert (field.annotation, field.description, field.metadata) == (
            source.annotation,
            source.description,
            source.metadata,
        ), key
        assert field.get_default(call_default_factory=True) == source.get_default(
            call_default_factory=True
        ), key


def test_the_judge_s_model_is_its_own_key_listed_under_rl() -> None:
    """`inference.model` is wired from the run's `model`; `judge.model` is the judge's own."""
    listed = [path for path, *_ in iter_fields(RLConfig)]
    assert "judge.model" in listed and "judge.port" in listed
    assert "weight_roots" not in str(JudgeServerConfig.model_json_schema())


def test_the_judge_takes_no_weight_update_or_lora_key() -> None:
    dropped = set(POLICY_SERVER_KEYS)
    assert {"weight_roots", "enable_lora", "max_lora_rank", "max_loras", "max_cpu_loras"} <= dropped
    assert {key for key in InferenceConfig.model_fields if key.startswith("weight_")} <= dropped
    assert dropped.isdisjoint(JUDGE_KEYS)
    assert dropped | set(JUDGE_KEYS) == set(InferenceConfig.model_fields)


def test_the_judge_s_inference_config_serves_its_keys_and_loads_no_weights() -> None:
    judge = JudgeServerConfig(
        model="judge-model", port=8601, dtype="float32", max_model_len=256, max_num_seqs=64,
        served_model_name="grader", enable_prefix_caching=True, rope_scaling={"factor": 2.0},
    )  # fmt: skip
    served = judge.inference_config()
    assert isinstance(served, InferenceConfig)
    assert (served.weight_roots, served.enable_lora) == ([], False)
    assert served.weight_broadcast_type == "filesystem"  # nothing pushed to it
    for key in JUDGE_KEYS:
        assert getattr(served, key) == getattr(judge, key), key
    assert served.max_prompts_per_request == InferenceConfig.model_fields[
        "max_prompts_per_request"
    ].get_default(call_default_factory=True)


def test_rl_refuses_an_inference_key_the_judge_does_not_take_and_names_it() -> None:
    with pytest.raises(ConfigError) as error:
        validate_config(RLConfig, rl({"model": "j", "weight_broadcast_type": "nccl"}))
    message = str(error.value)
    assert "`judge.weight_broadcast_type` is an `inference` key the judge does not take" in message
    assert "frozen model" in message


def test_rl_names_every_refused_judge_key_at_once() -> None:
    both = r"`judge\.weight_roots`, `judge\.enable_lora` are `inference` keys"
    with pytest.raises(ConfigError, match=both):
        validate_config(RLConfig, rl({"model": "j", "enable_lora": True, "weight_roots": []}))


def test_a_misspelt_judge_key_is_unknown_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"`judge\.max_num_seq`: unknown key; did you mean "):
        validate_config(RLConfig, rl({"model": "j", "max_num_seq": 4}))


def test_a_judge_the_inference_server_would_refuse_is_refused_when_the_config_is_read() -> None:
    with pytest.raises(ConfigError, match=r"`judge`: `tp`/`dp` \(2/1\) need `backend: vllm`"):
        validate_config(RLConfig, rl({"model": "j", "tp": 2}))


def test_the_judges_page_names_every_key_the_judge_takes_and_refuses() -> None:
    page = JUDGES_PAGE.read_text()
    named = [key for key in (*JUDGE_KEYS, *POLICY_SERVER_KEYS) if f"`{key}`" not in page]
    unnamed = [key for key in named if not key.startswith("weight_broadcast_")]
    assert "`weight_broadcast_*`" in page and not unnamed, unnamed
