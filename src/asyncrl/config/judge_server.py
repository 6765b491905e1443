"""Configuration of the judge server `asyncrl rl` starts (its `judge` section).

The judge is `asyncrl infer` serving a frozen model to the run's judge terms, so it takes the
inference server's keys that shape how a model is served (engine, sizes, memory, network, the
server's own limits) and none of those that only a policy server uses: receiving trained weights
(`weight_roots`, `weight_broadcast_*`), LoRA adapters (`enable_lora`, `max_lora*`), and what only
the orchestrator's requests need (batched `/v1/completions` prompts, tool calls, a request's own
chat template). Each kept key is `InferenceConfig`'s field itself (name, type, default,
description and bounds), so the two cannot drift apart; `inference_config()` is what
`asyncrl infer` receives.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError, create_model, model_validator
from pydantic.fields import FieldInfo

from asyncrl.config.base import StrictModel
from asyncrl.config.inference import InferenceConfig

# the InferenceConfig keys a frozen judge server takes, in InferenceConfig's order
JUDGE_KEYS = (
    "model", "backend", "executable", "extra_args", "startup_timeout", "host", "port",
    "api_key_var", "served_model_name", "dtype", "max_num_seqs", "max_num_batched_tokens",
    "max_request_bytes", "max_queued_seqs", "max_connections", "request_read_timeout",
    "shutdown_timeout", "max_model_len", "enforce_eager", "trust_remote_code", "tp", "dp",
    "enable_prefix_caching", "gpu_memory_utilization", "reasoning_parser",
    "kv_cache_memory_bytes", "rope_scaling",
)  # fmt: skip

# the inference server's keys the judge refuses, named in the error (`_no_policy_server_keys`)
POLICY_SERVER_KEYS = tuple(key for key in InferenceConfig.model_fields if key not in JUDGE_KEYS)

# what `inference_config()` adds: weight updates are read from nowhere, no adapters are loaded
FROZEN = {"weight_roots": [], "enable_lora": False}


class _JudgeServer(StrictModel):
    """A frozen judge model served by `asyncrl infer`: the checks and the conversion; the fields
    are `JUDGE_KEYS`, added from `InferenceConfig` by `create_model` below."""

    @model_validator(mode="before")
    @classmethod
    def _no_policy_server_keys(cls, data: Any) -> Any:
        """A key copied from `inference:` that the judge drops gets a reason, not only
        "unknown key" (keys that are no inference key at all get the usual did-you-mean)."""
        if not isinstance(data, dict):
            return data
        refused = [f"`judge.{key}`" for key in POLICY_SERVER_KEYS if key in data]
        if refused:
            what = "is an `inference` key" if len(refused) == 1 else "are `inference` keys"
            raise ValueError(
                f"{', '.join(refused)} {what} the judge does not take: the judge serves a frozen "
                "model to the judge terms, so weight updates, LoRA adapters, batched completions, "
                "tool calls and request chat templates do not apply (docs/judges.md lists its keys)"
            )
        return data

    @model_validator(mode="after")
    def _is_a_server_config(self) -> _JudgeServer:
        """Refuse at load time what `asyncrl infer` would refuse when the judge starts (`tp`
        with the embedded engine), with the inference server's own message."""
        try:
            self.inference_config()
        except ValidationError as error:
            raise ValueError(
                "; ".join(item["msg"].removeprefix("Value error, ") for item in error.errors())
            ) from None
        return self

    def inference_config(self) -> InferenceConfig:
        """The config `asyncrl infer` starts the judge with: these keys, no weight roots (every
        weight or adapter load is refused) and LoRA off; the rest at the inference defaults."""
        return InferenceConfig.model_validate({**self.model_dump(), **FROZEN})


def _judge_field(key: str) -> tuple[Any, FieldInfo]:
    """`InferenceConfig`'s field `key`, less a `wired` mark: `inference.model` follows the run's
    `model` (and is not listed under `asyncrl rl`), the judge's is its own and is listed."""
    field = InferenceConfig.model_fields[key]
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "wired" in extra:
        own = {name: value for name, value in extra.items() if name != "wired"}
        field = FieldInfo.merge_field_infos(field, json_schema_extra=own or None)
    return field.annotation, field


JudgeServerConfig = create_model(
    "JudgeServerConfig",
    __base__=_JudgeServer,
    __module__=__name__,
    __doc__="The judge server `asyncrl rl` starts: `inference` keys that mean something for a "
    "frozen model.",
    **{key: _judge_field(key) for key in JUDGE_KEYS},
)
