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

import json
import math
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config.ray import RayConfig
from asyncrl.config.rl import RLConfig
from asyncrl.fs import atomic_write_bytes
from asyncrl.launch.cluster_configs import (
    Endpoints,
    inference_sections,
    orchestrator_section,
    rank_environment,
    trainer_section,
    url_host,
)
from asyncrl.launch.live_view import LiveView
from asyncrl.launch.placement import Node, Slot, address_key, explain_unplaceable, plan_slots
from asyncrl.launch.placement import rank_order as order_ranks
from asyncrl.launch.ray_auth import (
    AUTH_MODE,
    JoinedAuth,
    authenticate_local_instance,
    explain_unborn_actor,
)
from asyncrl.launch.role_actor import RoleActor
from asyncrl.launch.roles import RoleFailed, prepare_resume, reporter_for, role_yaml
from asyncrl.launch.shared_storage import judge_shared_storage, probe_dir, remove_probes
from asyncrl.launch.supervisor import (
    RESUME_ARGUMENTS,
    RestartBudget,
    how_it_ended,
    why_not_restartable,
)
from asyncrl.log import get_logger
from asyncrl.processes import tail
from asyncrl.run_secret import RUN_SECRET_ENV, new_run_secret, run_secret

logger = get_logger(__name__)

LOOPBACK = "127.0.0.1"
ROLE_NAMES = {"infer": "inference server", "orch": "orchestrator", "train": "trainer rank"}
CALL_TIMEOUT = 60.0  # seconds any one actor call may take before the actor counts as hung


@dataclass
class Member:
    """One actor of the run and what the driver knows about it."""

    label: str  # infer-0, orch, train-1: the name in logs and messages
    slot: Slot
    actor: Any  # ray.actor.ActorHandle
    ray_name: str
    place: dict[str, Any] = field(default_factory=dict)
    url: str | None = None  # inference replicas
    rank: int | None = None  # trainer ranks
    log_offset: int = 0

    @property
    def role(self) -> str:
        return self.slot.role

    def describe(self) -> str:
        where = self.place.get("address", "?")
        return (
            f"{ROLE_NAMES[self.role]} `{self.label}` (Ray actor {self.ray_name} on {where}, "
            f"pid {self.place.get('pid')})"
        )


def unit_of(member: Member) -> str:
    """What restarts together: a server or the orchestrator alone, the trainer's ranks as one."""
    return "train" if member.role == "train" else member.label


def run_rl_on_ray(config: RLConfig) -> None:
    ray = _import_ray()
    config = prepare_resume(config)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # same path as Ctrl-C
    auth = connect(ray, config)
    run = RayRun(ray, config, auth)
    try:
        run.reserve()
        run.start_roles()
        run.supervise()
        run.report_servers()
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


class RayRun:
    def __init__(self, ray: Any, config: RLConfig, auth: JoinedAuth | None = None) -> None:
        self.ray = ray
        self.config = config
        self.auth = auth or JoinedAuth(switched_on_by_ray=False)
        self.output = Path(config.output_dir).resolve()
        self.logs = self.output / "logs"
        self.run_id = secrets.token_hex(3)
        self.placement_group: Any = None
        self.members: list[Member] = []
        self.budgets: dict[str, RestartBudget] = {}
        self.pending: dict[str, float] = {}  # unit -> when it restarts
        # on a cluster the servers listen on the network: they always require a key
        self.on_cluster = config.ray.address is not None
        # guards the zmq transport and the torch stores between the roles (run_secret.py)
        self.run_secret = run_secret() or new_run_secret()
        self.api_key = os.environ.get(config.inference.api_key_var) or None
        if self.on_cluster and self.api_key is None:
            self.api_key = secrets.token_urlsafe(32)
            logger.info("rl: the inference servers require a fresh API key (set %s to choose it)",
                        config.inference.api_key_var)  # fmt: skip

    # placement ---------------------------------------------------------------------------------
    def reserve(self) -> None:
        """One placement group for the whole run, then one actor per bundle."""
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        settings = self.config.ray
        slots = plan_slots(self.config)
        self.placement_group = placement_group(
            [slot.resources for slot in slots],
            strategy=settings.strategy,
            name=f"asyncrl-{self.run_id}",
        )
        try:
            self.ray.get(self.placement_group.ready(), timeout=settings.placement_timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise RoleFailed(
                explain_unplaceable(
                    slots, self.nodes(), settings.strategy, settings.placement_timeout
                )
            ) from None
        node_addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in self.ray.nodes()}
        table = placement_group_table(self.placement_group)
        bundle_address = {
            int(b): node_addresses.get(node, "") for b, node in table["bundles_to_node_id"].items()
        }
        remote_actor = self.ray.remote(RoleActor)
        # replicas and rank candidates numbered by node address, so the names follow the machines
        for role in ("infer", "orch", "train"):
            bundles = [b for b, slot in enumerate(slots) if slot.role == role]
            bundles.sort(key=lambda b: (address_key(bundle_address[b]), b))
            for number, bundle in enumerate(bundles):
                slot = slots[bundle]
                label = "orch" if role == "orch" else f"{role}-{number}"
                ray_name = f"asyncrl-{self.run_id}-{label}"
                options = remote_actor.options(
                    name=ray_name,
                    num_cpus=slot.resources.get("CPU", 0.0),
                    num_gpus=slot.resources.get("GPU", 0.0),
                    max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.placement_group, placement_group_bundle_index=bundle
                    ),
                )
                member = Member(label, slot, None, ray_name)
                try:
                    member.actor = options.remote(label)
                except self.ray.exceptions.RaySystemError as error:
                    # the cluster already gave up on this driver (an earlier actor was destroyed):
                    # Ray cancels the creation itself, "Actor creation cancelled"
                    raise RoleFailed(
                        f"{member.describe()} died before it ran.\n"
                        f"{explain_unborn_actor(error, self.auth, self.ray)}"
                    ) from None
                self.members.append(member)
        # the first call waits for every actor's worker process (and its runtime_env) to start
        places = self.call_all(
            self.members, lambda m: m.actor.place.remote(), timeout=settings.startup_timeout
        )
        for member in self.members:
            member.place = places[member.label]
        self.assign_ranks()
        self.make_budgets()
        self.write_roles()

    def make_budgets(self) -> None:
        """One restart budget per inference replica, for the orchestrator, and for the trainer
        (its ranks restart together)."""
        for member in self.members:
            unit = unit_of(member)
            what = "the trainer's ranks" if unit == "train" else member.describe()
            self.budgets.setdefault(unit, RestartBudget(
                what, self.config.restart, why_not_restartable(member.role, self.config)
            ))  # fmt: skip

    def nodes(self) -> list[Node]:
        """The live nodes; what is free now is known per node only on a one-node cluster."""
        alive = [n for n in self.ray.nodes() if n.get("Alive")]
        free = self.ray.available_resources() if len(alive) == 1 else None
        return [Node(n["NodeManagerAddress"], dict(n["Resources"]), free) for n in alive]

    def assign_ranks(self) -> None:
        """Ranks by node address, then device: the same cluster gives the same ranks."""
        ranks = [m for m in self.members if m.role == "train"]
        order = order_ranks([(m.place["address"], m.place["devices"]) for m in ranks])
        for rank, position in enumerate(order):
            ranks[position].rank = rank
            ranks[position].label = f"train-{rank}"

    # start-up ----------------------------------------------------------------------------------
    def start_roles(self) -> None:
        self.check_shared_storage()
        endpoints = self.endpoints()
        servers = self.of("infer")
        sections = inference_sections(self.config, endpoints)
        for member, section in zip(servers, sections, strict=True):
            member.url = f"http://{url_host(section.host)}:{section.port}"
            env = {section.api_key_var: self.api_key} if self.api_key else {}
            self.start(member, "infer", role_yaml(section), env)
        self.write_roles()
        self.wait_servers_healthy()
        logger.info("rl: %d inference server(s) ready: %s", len(servers),
                    ", ".join(str(m.url) for m in servers))  # fmt: skip
        trainer = trainer_section(self.config, endpoints)
        world_size = self.config.trainer.world_size
        for member in sorted(self.of("train"), key=lambda m: m.rank or 0):
            assert member.rank is not None
            env = rank_environment(member.rank, world_size, endpoints) if world_size > 1 else {}
            self.start(member, "train", role_yaml(trainer), env)
        orchestrator = orchestrator_section(self.config, endpoints)
        key_var = orchestrator.client.api_key_var
        self.start(self.of("orch")[0], "orch", role_yaml(orchestrator),
                   {key_var: self.api_key} if self.api_key else {})  # fmt: skip
        self.write_roles()

    def endpoints(self) -> Endpoints:
        """Where each role listens: loopback on a local instance, the node's address on a
        cluster, on ports free on that node."""

        def host(member: Member) -> str:
            return str(member.place["address"]) if self.on_cluster else LOOPBACK

        servers = self.of("infer")
        ports = self.call_all(servers, lambda m: m.actor.free_ports.remote(1))
        orchestrator = self.of("orch")[0]
        rank0 = next(m for m in self.of("train") if m.rank == 0)
        zmq = self.config.orchestrator.rollout_transport.type == "zmq"
        rollout_port = self.ray.get(orchestrator.actor.free_ports.remote(1))[0] if zmq else None
        master_port, broadcast_port = self.ray.get(rank0.actor.free_ports.remote(2))
        nccl = self.config.trainer.weight_broadcast.type == "nccl"
        return Endpoints(
            servers=[(host(m), ports[m.label][0]) for m in servers],
            orchestrator_host=host(orchestrator),
            rollout_port=rollout_port,
            trainer_host=host(rank0),
            master_port=master_port,
            broadcast_port=broadcast_port if nccl else None,
        )

    def check_shared_storage(self) -> None:
        """Every actor writes a probe into the run directory and looks for everyone else's."""
        probes = str(probe_dir(self.output, self.run_id))
        tokens = {m.label: secrets.token_hex(8) for m in self.members}
        try:
            write_errors = self.call_all(
                self.members, lambda m: m.actor.write_probe.remote(probes, tokens[m.label])
            )
            unseen = self.call_all(
                self.members, lambda m: m.actor.missing_probes.remote(probes, tokens)
            )
        finally:  # on every node (a node-local run directory too), then here
            self.call_all(self.members, lambda m: m.actor.remove_probe.remote(probes))
            remove_probes(self.output, self.run_id)
        judge_shared_storage(self.config, self.output, write_errors, unseen)

    def start(self, member: Member, role: str, config_yaml: str, env: dict[str, str]) -> None:
        config_path = str(self.output / "configs" / f"{member.label}.yaml")
        env = {**env, RUN_SECRET_ENV: self.run_secret}
        member.place["role_pid"] = self.ray.get(
            member.actor.start.remote(role, config_yaml, config_path, env, os.getcwd()),
            timeout=CALL_TIMEOUT,
        )

    def wait_servers_healthy(self) -> None:
        deadline = time.monotonic() + self.config.ray.startup_timeout
        waiting = list(self.of("infer"))
        while waiting:
            self.stream_logs()
            self.check_exits()
            ready = self.call_all(waiting, lambda m: m.actor.healthy.remote(m.url))
            waiting = [m for m in waiting if not ready[m.label]]
            if waiting and time.monotonic() > deadline:
                raise RoleFailed(
                    f"{waiting[0].describe()} not healthy after "
                    f"{self.config.ray.startup_timeout:g} s; end of its log:\n"
                    f"{tail(self.log_path(waiting[0]))}"
                )
            time.sleep(0.5)

    # the run -----------------------------------------------------------------------------------
    def supervise(self) -> None:
        """Until trainer and orchestrator finish, restarting a role whose process dies or hangs
        (`restart`; the trainer's ranks together); a role past its budget, or a dead actor,
        stops everything."""
        finishing = [m for m in self.members if m.role != "infer"]
        view = LiveView(Path(self.config.orchestrator.output_dir) / "metrics.jsonl",
                        self.config.max_steps)  # fmt: skip
        reporter = reporter_for(self.config)
        try:
            with view:
                while True:
                    self.stream_logs()
                    codes = self.check_roles()
                    view.refresh()
                    if reporter is not None:
                        reporter.refresh()
                    if not self.pending and all(codes[m.label] == 0 for m in finishing):
                        logger.info("rl: trainer and orchestrator finished")
                        return
                    time.sleep(0.5)
        finally:
            if reporter is not None:
                reporter.close()

    def check_roles(self) -> dict[str, int | None]:
        """Each role's exit code; a role that died or hung is stopped with the rest of its
        unit (every trainer rank: their process group is gone) and restarted after its backoff."""
        now = time.monotonic()
        for unit, restart_at in list(self.pending.items()):
            if now >= restart_at:
                del self.pending[unit]
                self.restart(unit)
        statuses = self.call_all(self.members, lambda m: m.actor.status.remote())
        for member in self.members:
            unit = unit_of(member)
            code, silent = statuses[member.label]
            budget = self.budgets[unit]
            if unit in self.pending:
                continue
            if code is None and budget.hung(silent):
                self.ray.get(member.actor.kill_role.remote(), timeout=CALL_TIMEOUT)
                ending = f"hung (no heartbeat for {silent:.0f} s) and was killed"
            elif code not in (None, 0) or (member.role == "infer" and code == 0):
                ending = how_it_ended(code) if code else "stopped before training ended"
            else:
                continue
            self.stream_logs()
            self.pending[unit] = budget.after_failure(ending, self.log_path(member), now, code)
            others = [m for m in self.members if unit_of(m) == unit and m is not member]
            self.call_all(others, lambda m: m.actor.stop.remote())
        return {label: code for label, (code, _) in statuses.items()}

    def restart(self, unit: str) -> None:
        """Start a unit's roles again, each resuming from its last checkpoint."""
        for member in sorted(self.members, key=lambda m: m.rank or 0):
            if unit_of(member) == unit:
                extra = RESUME_ARGUMENTS[member.role]
                member.place["role_pid"] = self.ray.get(
                    member.actor.restart.remote(extra), timeout=CALL_TIMEOUT
                )
        self.write_roles()

    def check_exits(self) -> dict[str, int | None]:
        """At start-up: any role that exits stops the run."""
        codes = self.call_all(self.members, lambda m: m.actor.poll.remote())
        for member in self.members:
            code = codes[member.label]
            if code not in (None, 0) or (member.role == "infer" and code == 0):
                self.stream_logs()
                what = f"exited with code {code}" if code else "stopped before training ended"
                raise RoleFailed(
                    f"{member.describe()} {what}; end of "
                    f"{self.log_path(member)}:\n{tail(self.log_path(member))}"
                )
        return codes

    def report_servers(self) -> None:
        """Log (and keep in roles.json) what each server ends with: weights and tokens served."""
        states = self.call_all(
            self.of("infer"),
            lambda m: m.actor.server_state.remote(m.url, self.config.inference.api_key_var),
        )
        for member in self.of("infer"):
            state = states[member.label]
            member.place["final"] = state
            logger.info(
                "rl: %s at %s holds weights version %s; %s tokens generated", member.label,
                member.url, state.get("version"), f"{state.get('generation_tokens_total', 0):,.0f}",
            )  # fmt: skip
        self.write_roles()

    # plumbing ----------------------------------------------------------------------------------
    def of(self, role: str) -> list[Member]:
        return [m for m in self.members if m.role == role]

    def call_all(
        self,
        members: Iterable[Member],
        call: Callable[[Member], Any],
        timeout: float = CALL_TIMEOUT,
    ) -> dict[str, Any]:
        """One call on each actor, in parallel; a dead or hung actor stops the run, named."""
        members = list(members)
        refs = [(member, call(member)) for member in members]
        results = {}
        for member, ref in refs:
            try:
                results[member.label] = self.ray.get(ref, timeout=timeout)
            except self.ray.exceptions.RayActorError as error:
                if not member.place:  # it never ran: its role has no log to show
                    raise RoleFailed(
                        f"{member.describe()} died before it ran.\n"
                        f"{explain_unborn_actor(error, self.auth, self.ray)}"
                    ) from None
                first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise RoleFailed(
                    f"{member.describe()} died ({first_line}); end of "
                    f"{self.log_path(member)}:\n{tail(self.log_path(member))}"
                ) from None
            except self.ray.exceptions.GetTimeoutError:
                raise RoleFailed(f"{member.describe()} did not answer in {timeout:g} s") from None
        return results

    def log_path(self, member: Member) -> Path:
        return self.logs / f"{member.label}.log"

    def stream_logs(self) -> None:
        """Append what each role logged since the last call to its file in logs/."""
        self.logs.mkdir(parents=True, exist_ok=True)
        refs = [(m, m.actor.read_log.remote(m.log_offset)) for m in self.members]
        for member, ref in refs:
            try:
                chunk, member.log_offset = self.ray.get(ref, timeout=CALL_TIMEOUT)
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
                continue  # check_exits names the dead actor; keep what was streamed
            if chunk:
                with open(self.log_path(member), "ab") as log:
                    log.write(chunk)

    def write_roles(self) -> None:
        """`logs/roles.json`: where each role runs (node, pid, URL, rank) and how it ended."""
        records = [
            {"label": m.label, "role": m.role, "ray_name": m.ray_name,
             "resources": m.slot.resources, "url": m.url, "rank": m.rank, **m.place}
            for m in self.members
        ]  # fmt: skip
        self.logs.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.logs / "roles.json", json.dumps(records, indent=1).encode())

    def remove(self) -> None:
        """Stop every role (gently, then not), kill every actor, remove the placement group."""
        from ray.util.placement_group import remove_placement_group

        stopping = [member.actor.stop.remote() for member in self.members]
        try:
            self.ray.wait(stopping, num_returns=len(stopping), timeout=30)
            self.stream_logs()
            # each actor's scratch directory (a copy of its role's log) goes with it
            cleaning = [member.actor.cleanup.remote() for member in self.members]
            self.ray.wait(cleaning, num_returns=len(cleaning), timeout=30)
        finally:
            for member in self.members:
                self.ray.kill(member.actor)
            if self.placement_group is not None:
                remove_placement_group(self.placement_group)
