"""What every launcher does with a run's roles, whichever machines they run on: the resume step
both roles agree on, each role's config as a file, the keys every role holds, the error a failed
role becomes, and the trackers that follow the run."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel

from asyncrl.checkpoint.layout import forget_after, resolve_resume_step
from asyncrl.config.rl import RLConfig
from asyncrl.log import get_logger
from asyncrl.monitor.trackers import Reporter
from asyncrl.run_secret import RUN_SECRET_ENV, keys_for, new_run_secret, run_secret, withhold

logger = get_logger(__name__)


class RoleFailed(RuntimeError):
    """A role exited with an error (or its actor died); the message holds the end of its log."""


def role_yaml(section: BaseModel) -> str:
    """A role's config as `asyncrl <role> <file>` reads it back."""
    return yaml.safe_dump(section.model_dump(mode="json"), sort_keys=False)


def prepare_resume(config: RLConfig) -> RLConfig:
    """With `ckpt.resume_step`, both roles resume from the same step: the one requested, or
    the latest complete for both; what the crashed run made after it is removed first."""
    requested = config.orchestrator.ckpt.resume_step
    if requested is None:
        return config
    run_dir = Path(config.orchestrator.output_dir)
    step = resolve_resume_step(requested, run_dir, ("trainer", "orchestrator"))
    forget_after(run_dir, step or 0)
    logger.info("rl: resuming after step %s", step if step is not None else "0 (fresh start)")
    config = config.model_copy(deep=True)
    config.orchestrator.ckpt.resume_step = step
    config.trainer.resume_step = step
    return config


def reporter_for(config: RLConfig) -> Reporter | None:
    """The trackers of `report_to`, following the run directory (None without `report_to`)."""
    if config.report_to is None:
        return None
    run_dir = Path(config.orchestrator.output_dir)
    return Reporter(config.report_to, run_dir, config.model_dump(mode="json"))


def key_variables(config: RLConfig) -> list[str]:
    """The variables the config names for a key: the servers', the env-servers', the judges'."""
    variables = [config.inference.api_key_var, *config.orchestrator.secret_variables()]
    if config.judge is not None:
        variables.append(config.judge.api_key_var)
    return variables


def hold_run_keys(config: RLConfig) -> None:
    """Before a launcher starts anything (a role, a local Ray instance, whose raylet and workers
    inherit the launcher's environment): the keys you exported in the variables the config
    names, moved out of this process's environment into memory (`run_secret.hold`)."""
    withhold(*key_variables(config))


def run_keys(config: RLConfig, secret: str | None = None) -> dict[str, str]:
    """What every role of the run holds: the run's secret (`secret`, else the one this process
    holds, else a fresh one) and the keys the user set in the variables the config names (the
    servers', the env-servers', the judges'); a server's key the user did not set, each role
    derives from the secret (`run_secret.server_key`)."""
    secret = secret or run_secret() or new_run_secret()
    return {RUN_SECRET_ENV: secret, **keys_for(*key_variables(config))}
