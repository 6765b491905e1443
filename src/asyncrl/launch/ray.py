"""`asyncrl rl --launcher ray`: the same three roles, as Ray actors on a cluster.

One placement group holds a bundle per inference replica, one for the orchestrator and one per
trainer rank (`ray.strategy`, PACK by default). Each bundle gets a `RoleActor`, which runs its
role exactly as `asyncrl infer|orch|train` runs it. This process, the driver, wires the roles
together from the addresses the actors report (every server's URL to the orchestrator, rank 0's
address to the other ranks), checks that they share the run directory where the config needs it,
streams every role's log into `<output_dir>/logs/<label>.log`, shows the live view, and ends the
run when trainer and orchestrator have finished. A role whose process dies or hangs is restarted
by its actor from its last checkpoint, as the local launcher does (`restart`; the trainer's ranks
together, since their process group dies with any of them); a role past its restart budget, or a
dead actor (a lost node), stops the run with its label and last log lines; whatever ends the
run, every actor and the placement group are removed. Ray gives each actor `OMP_NUM_THREADS`
equal to its bundle's CPUs, and its children inherit it. What crosses between driver and actors
is Ray's own traffic (plain strings and numbers); the cluster must be one you trust, as for any
Ray job.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from typing import Any

from asyncrl.config.ray import RayConfig
from asyncrl.config.rl import RLConfig
from asyncrl.launch.placement import plan_slots
from asyncrl.launch.ray_auth import AUTH_MODE, JoinedAuth, authenticate_local_instance
from asyncrl.launch.ray_placement import reserve
from asyncrl.launch.ray_run import CALL_TIMEOUT, RayRun, unit_of
from asyncrl.launch.ray_wiring import start_roles
from asyncrl.launch.roles import RoleFailed, hold_run_keys, prepare_resume
from asyncrl.launch.supervisor import RESUME_ARGUMENTS, how_it_ended, supervise_until_finished
from asyncrl.log import get_logger

logger = get_logger(__name__)


def run_rl_on_ray(config: RLConfig) -> None:
    ray = _import_ray()
    hold_run_keys(config)  # a local Ray instance, and every actor, inherits this environment
    config = prepare_resume(config)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # same path as Ctrl-C
    auth = connect(ray, config)
    run = RayRun(ray, config, auth)
    try:
        reserve(run)
        start_roles(run)
        supervise(run)
        report_servers(run)
    except KeyboardInterrupt:
        logger.warning("rl: interrupted; removing every actor and the placement group")
        raise
    finally:
        run.remove()
        ray.shutdown()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise RoleFailed(
            "`launcher: ray` needs Ray on this machine and every node: pip install 'asyncrl[ray]'"
        ) from error
    return ray


def connect(ray: Any, config: RLConfig) -> JoinedAuth:
    """Join the cluster `ray.address` names, or start a local instance for this run only
    (`ray_auth.py`: how each is authenticated)."""
    settings: RayConfig = config.ray
    options: dict[str, Any] = {
        "namespace": settings.namespace,
        "runtime_env": settings.runtime_env or None,
        "log_to_driver": False,  # every role's log is streamed into logs/ instead
        "logging_level": "WARNING",
    }
    if settings.address is None:
        asked = sum(slot.resources.get("CPU", 0.0) for slot in plan_slots(config))
        cpus = settings.num_cpus or max(os.cpu_count() or 1, math.ceil(asked))
        options |= {"address": "local", "num_cpus": cpus, "include_dashboard": False,
                    "object_store_memory": 1 << 28}  # fmt: skip
        own_secret = authenticate_local_instance()
        logger.info("rl: starting a local Ray instance with %d logical CPUs%s", cpus,
                    ", authenticated with this run's own token" if own_secret else "")  # fmt: skip
    else:
        options["address"] = settings.address
    chosen_mode = os.environ.get(AUTH_MODE)
    ray.init(**options)
    return JoinedAuth.around(chosen_mode)


def supervise(run: RayRun) -> None:
    """Until trainer and orchestrator finish, restarting a role whose process dies or hangs
    (`restart`; the trainer's ranks together); a role past its budget, or a dead actor,
    stops everything. Every role's new log lines are streamed in on each check."""
    finishing = [m for m in run.members if m.role != "infer"]

    def finished() -> bool:
        run.stream_logs()
        codes = check_roles(run)
        return not run.pending and all(codes[m.label] == 0 for m in finishing)

    supervise_until_finished(run.config, finished)


def check_roles(run: RayRun) -> dict[str, int | None]:
    """Each role's exit code; a role that died or hung is stopped with the rest of its
    unit (every trainer rank: their process group is gone) and restarted after its backoff."""
    now = time.monotonic()
    for unit, restart_at in list(run.pending.items()):
        if now >= restart_at:
            del run.pending[unit]
            restart(run, unit)
    statuses = run.call_all(run.members, lambda m: m.actor.status.remote())
    for member in run.members:
        unit = unit_of(member)
        code, silent = statuses[member.label]
        budget = run.budgets[unit]
        if unit in run.pending:
            continue
        if code is None and budget.hung(silent):
            run.ray.get(member.actor.kill_role.remote(), timeout=CALL_TIMEOUT)
            ending = f"hung (no heartbeat for {silent:.0f} s) and was killed"
        elif code not in (None, 0) or (member.role == "infer" and code == 0):
            ending = how_it_ended(code) if code else "stopped before training ended"
        else:
            continue
        run.stream_logs()
        run.pending[unit] = budget.after_failure(ending, run.log_path(member), now, code)
        others = [m for m in run.members if unit_of(m) == unit and m is not member]
        run.call_all(others, lambda m: m.actor.stop.remote())
    return {label: code for label, (code, _) in statuses.items()}


def restart(run: RayRun, unit: str) -> None:
    """Start a unit's roles again, each resuming from its last checkpoint."""
    for member in sorted(run.members, key=lambda m: m.rank or 0):
        if unit_of(member) == unit:
            extra = RESUME_ARGUMENTS[member.role]
            member.place["role_pid"] = run.ray.get(
                member.actor.restart.remote(extra), timeout=CALL_TIMEOUT
            )
    run.write_roles()


def report_servers(run: RayRun) -> None:
    """Log (and keep in roles.json) what each server ends with: weights and tokens served."""
    states = run.call_all(
        run.of("infer"),
        lambda m: m.actor.server_state.remote(m.url, run.config.inference.api_key_var),
    )
    for member in run.of("infer"):
        state = states[member.label]
        member.place["final"] = state
        logger.info(
            "rl: %s at %s holds weights version %s; %s tokens generated", member.label,
            member.url, state.get("version"), f"{state.get('generation_tokens_total', 0):,.0f}",
        )  # fmt: skip
    run.write_roles()
