"""The driver's view of a Ray run: its actors (`Member`), how it calls them (every call in
parallel, under a deadline, a dead or hung actor named), their logs streamed into
`<output_dir>/logs/`, `logs/roles.json`, and the removal of everything at the end.

Placement (`ray_placement.py`), wiring the roles together (`ray_wiring.py`) and supervising the
run (`ray.py`) all act through a `RayRun`.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config.rl import RLConfig
from asyncrl.fs import atomic_write_bytes
from asyncrl.launch.placement import Slot
from asyncrl.launch.ray_auth import JoinedAuth, explain_unborn_actor
from asyncrl.launch.roles import RoleFailed, run_keys
from asyncrl.launch.supervisor import RestartBudget
from asyncrl.log import get_logger
from asyncrl.processes import tail
from asyncrl.run.layout import config_file, log_file, logs_dir, roles_record

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


class RayRun:
    def __init__(self, ray: Any, config: RLConfig, auth: JoinedAuth | None = None) -> None:
        self.ray = ray
        self.config = config
        self.auth = auth or JoinedAuth(switched_on_by_ray=False)
        self.output = Path(config.output_dir).resolve()
        self.logs = logs_dir(self.output)
        self.run_id = secrets.token_hex(3)
        self.placement_group: Any = None
        self.members: list[Member] = []
        self.budgets: dict[str, RestartBudget] = {}
        self.pending: dict[str, float] = {}  # unit -> when it restarts
        # on a cluster the servers listen on the network: they always require a key
        self.on_cluster = config.ray.address is not None
        # the run's secret, which guards the zmq transport and the torch stores between the roles
        # and gives the servers their key (run_secret.py), and any key the user set: each actor
        # hands them to its role over a socket (`secret_handover.py`), never in its environment
        self.keys = run_keys(config)

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

    def start(self, member: Member, role: str, config_yaml: str, env: dict[str, str]) -> None:
        config_path = str(config_file(self.output, member.label))
        member.place["role_pid"] = self.ray.get(
            member.actor.start.remote(role, config_yaml, config_path, env, os.getcwd(), self.keys),
            timeout=CALL_TIMEOUT,
        )

    def log_path(self, member: Member) -> Path:
        return log_file(self.output, member.label)

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
        atomic_write_bytes(roles_record(self.output), json.dumps(records, indent=1).encode())

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
