"""`asyncrl rl`: inference, orchestrator and trainer started together on this machine.

Each role runs as `asyncrl infer|orch|train <its config>` (files written to
`<output_dir>/configs/`, so any role can be restarted by hand the same way) with its log in
`<output_dir>/logs/`. Inference starts first and must answer /health; then the trainer and the
orchestrator. With `deployment: colocated` the trainer serves inference itself, so there is no
`infer` process: trainer and orchestrator start together and the orchestrator waits for the
trainer's server. The run ends when trainer and orchestrator have finished. A role that dies or
hangs is restarted from its last checkpoint (`restart`, see `supervisor.py`) while the others
go on; past its restart budget, or on Ctrl-C, every role is stopped and the failing role's log
tail is shown. Every role gets the run's secret (`$ASYNCRL_RUN_SECRET`, made afresh when unset),
which guards the channels the roles open between them and gives the servers their key
(`run_secret.py`), with any key the user exported: in memory (a forked role) or over a socket (an
exec'd one, `secret_handover.py`), never in a role's environment.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from asyncrl.config.deployment import machine_deployment
from asyncrl.config.rl import RLConfig
from asyncrl.core_lending import LEND_FLAG_ENV, LENT_CPUS_ENV
from asyncrl.cpu_affinity import CPUS_ENV, format_cores, usable_cores
from asyncrl.gpu_presence import gpu_count
from asyncrl.inference.access import server_api_key
from asyncrl.launch.gpu_placement import Placement, place_gpus, role_environment, visible_gpus
from asyncrl.launch.judge_role import judge_spec, judge_url
from asyncrl.launch.role_fork import forking_roles, preload
from asyncrl.launch.roles import hold_run_keys, prepare_resume, role_yaml, run_keys
from asyncrl.launch.serving_precision import serve_in_training_precision
from asyncrl.launch.supervisor import (
    RESUME_ARGUMENTS,
    RoleSpec,
    SupervisedRole,
    supervise_until_finished,
    why_not_restartable,
)
from asyncrl.log import get_logger
from asyncrl.processes import stop, wait_healthy
from asyncrl.run.layout import config_file, heartbeat_file, lend_flag_file, log_file
from asyncrl.run_secret import RUN_SECRET_ENV, adopt, new_run_secret, run_secret

logger = get_logger(__name__)

ROLES = ("infer", "orch", "train")


def write_role_configs(config: RLConfig, output: Path) -> dict[str, Path]:
    """Each role's resolved config in the output directory's `configs/`, as the role reads it."""
    sections = {"orch": config.orchestrator, "train": config.trainer}
    if config.deployment == "disaggregated":
        sections["infer"] = config.inference
    paths = {}
    for role, section in sections.items():
        path = config_file(output, role)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(role_yaml(section))
        paths[role] = path
    return paths


def thread_budget(
    colocated: bool = False, lend_flag: Path | None = None
) -> dict[str, dict[str, str]]:
    """On a CPU-only machine, split the cores between inference and trainer instead of letting
    each torch process use all of them (oversubscription slows both), and pin each to its
    half (`cpu_affinity.py`); a colocated trainer, whose engine and training take turns, gets
    every core. With `lend_flag`, the trainer lends its cores to the engine while it waits
    (`core_lending.py`). A user's own OMP_NUM_THREADS wins; GPU machines are left alone."""
    if gpu_count() or "OMP_NUM_THREADS" in os.environ:
        return {role: {} for role in ROLES}
    cores = usable_cores()
    if colocated:
        return {"train": {"OMP_NUM_THREADS": str(len(cores))},
                "orch": {"OMP_NUM_THREADS": "1"}, "infer": {}}  # fmt: skip
    half = max(1, len(cores) // 2)
    train, infer = cores[:half], cores[half:] or cores
    budget = {
        "train": {"OMP_NUM_THREADS": str(len(train)), CPUS_ENV: format_cores(train)},
        "infer": {"OMP_NUM_THREADS": str(len(infer)), CPUS_ENV: format_cores(infer)},
        "orch": {"OMP_NUM_THREADS": "1"},
    }
    if lend_flag is not None and set(train).isdisjoint(infer):
        budget["train"][LEND_FLAG_ENV] = str(lend_flag)
        budget["infer"] |= {LEND_FLAG_ENV: str(lend_flag), LENT_CPUS_ENV: format_cores(train)}
    return budget


def lend_flag_of(config: RLConfig, output: Path) -> Path | None:
    """Where the trainer says it waits, when this run lends its core to the engine: a
    one-process trainer beside the embedded engine (vLLM runs its own threads)."""
    lends = (
        config.lend_idle_cores
        and config.deployment == "disaggregated"
        and config.inference.backend == "embedded"
        and config.trainer.world_size == 1
    )
    return lend_flag_file(output) if lends else None


def deployment_reason(config: RLConfig) -> str:
    """What `deployment: auto` picks on this machine and why, beside the layout the run has."""
    chosen, reason = machine_deployment(config.launcher)
    if chosen == config.deployment:
        return f"what auto picks here: {reason}"
    return f"set in the config; auto would pick {chosen} here: {reason}"


def role_python(role: str, config: RLConfig) -> str:
    """This interpreter, except for a trainer that hosts vLLM's engine (colocated): the
    interpreter of vLLM's venv, where vLLM's own torch is."""
    colocated_vllm = config.deployment == "colocated" and config.inference.backend == "vllm"
    if role == "train" and colocated_vllm and config.inference.executable:
        return config.inference.executable
    return sys.executable


def gpu_placement(config: RLConfig, visible: list[str] | None = None) -> Placement:
    """The GPUs each role sees (`gpu_ids`, else the deployment's split; `visible`: the GPUs
    this launcher sees, found when not given)."""
    ids = config.gpu_ids
    return place_gpus(
        config.deployment, visible_gpus() if visible is None else visible,
        {"infer": ids.inference, "train": ids.trainer, "judge": ids.judge,
         "reward_model": ids.reward_model},
        config.trainer.world_size, judge=config.judge is not None,
        reward_models=config.orchestrator.cuda_reward_models(),
    )  # fmt: skip


def role_specs(
    config: RLConfig,
    paths: dict[str, Path],
    output: Path,
    secret: str | None = None,
    gpus: Placement | None = None,
) -> dict[str, RoleSpec]:
    """How each role starts, and restarts from its own last checkpoint, its log and heartbeat in
    the output directory `output`; every role holds the run's `secret` (and the keys the user
    set: `run_keys`) and sees the GPUs `gpus` gives it (none on a CPU-only machine)."""
    flag = lend_flag_of(config, output)
    if flag is not None:  # one a trainer that died while waiting left behind lends nothing now
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.unlink(missing_ok=True)
    threads = thread_budget(config.deployment == "colocated", flag)
    keys = run_keys(config, secret)
    gpus = gpus or gpu_placement(config)
    specs = {}
    for role, path in paths.items():
        first = [role_python(role, config), "-m", "asyncrl.cli", role, str(path)]
        env = {**threads[role], **role_environment(gpus, role)}
        specs[role] = RoleSpec(
            role, first, [*first, *RESUME_ARGUMENTS[role]], log_file(output, role),
            heartbeat_file(output, role), env,
            finishes=role != "infer",
            cannot_restart=why_not_restartable(role, config),
            fork=forking_roles(config.role_start),
            keys=keys,
        )  # fmt: skip
    return specs


def run_rl(config: RLConfig) -> None:
    hold_run_keys(config)  # no role inherits a key in its environment
    adopt({RUN_SECRET_ENV: run_secret() or new_run_secret()})  # one per run, for every role
    # every server is keyed (by the secret, if by nothing else); checked before any role starts
    server_api_key(config.inference)
    if config.judge is not None:
        server_api_key(config.judge.inference_config())
    if forking_roles(config.role_start):
        preload()  # once, for every role and restart (`role_fork.py`)
    output = Path(config.output_dir)
    config = serve_in_training_precision(prepare_resume(config))
    logger.info("rl: deployment %s (%s)", config.deployment, deployment_reason(config))
    gpus = gpu_placement(config)
    if gpus.roles:
        placed = ", ".join(f"{role} {','.join(ids)}" for role, ids in gpus.roles.items())
        logger.info("rl: GPUs %s (%s)", placed, gpus.reason)
    specs = role_specs(config, write_role_configs(config, output), output, gpus=gpus)
    judge = judge_spec(config, output, role_environment(gpus, "judge"))
    if judge is not None:
        judge.fork = forking_roles(config.role_start)
        judge.keys = specs["orch"].keys  # the same secret: it derives the same key
    colocated = config.deployment == "colocated"
    # the process that serves inference: a server of its own, or the trainer (colocated)
    server_role = "train" if colocated else "infer"
    roles: dict[str, SupervisedRole] = {}
    # SIGTERM (a scheduler, `kill`) takes the same path as Ctrl-C: the `finally` below stops the
    # children gently; if the launcher is SIGKILLed the kernel still ends them (PDEATHSIG)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        # a colocated trainer serves only once it has found the orchestrator's run directory and
        # resumed, so the orchestrator starts with it and waits for the server (startup_timeout)
        first = ("train", "orch") if colocated else ("infer",)
        if judge is not None:
            roles[judge.name] = SupervisedRole(judge, config.restart)
        for role in first:
            roles[role] = SupervisedRole(specs[role], config.restart)
        host = config.inference.host
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{config.inference.port}"
        wait_healthy(url, roles[server_role].process, timeout=600)
        logger.info("rl: inference ready at %s%s", url, " (in the trainer)" if colocated else "")
        if judge is not None:
            wait_healthy(judge_url(config), roles[judge.name].process, timeout=600)
            logger.info("rl: judge ready at %s", judge_url(config))
        for role in ("train", "orch"):
            if role not in roles:
                roles[role] = SupervisedRole(specs[role], config.restart)
        supervise(roles, config)
    except KeyboardInterrupt:
        logger.warning("rl: interrupted; stopping every role")
        raise
    finally:
        for role in roles.values():
            stop(role.process)


def supervise(roles: dict[str, SupervisedRole], config: RLConfig) -> None:
    """Until trainer and orchestrator finish, restarting a role that dies or hangs (a role past
    its restart budget stops everything)."""

    def check_roles() -> bool:
        for role in roles.values():
            role.check()
        return roles["train"].finished and roles["orch"].finished

    supervise_until_finished(config, check_roles)
