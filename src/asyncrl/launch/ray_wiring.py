"""Wiring a placed Ray run: check the actors share the run directory where the config needs it,
choose every role's address and ports on its own node, start the servers and wait until they
answer, then the trainer's ranks (rank 0's address to the others) and the orchestrator (every
server's URL)."""

from __future__ import annotations

import secrets
import time

from asyncrl.launch.cluster_configs import (
    Endpoints,
    inference_sections,
    orchestrator_section,
    rank_environment,
    trainer_section,
    url_host,
)
from asyncrl.launch.ray_run import LOOPBACK, Member, RayRun
from asyncrl.launch.roles import RoleFailed, role_yaml
from asyncrl.launch.shared_storage import judge_shared_storage, probe_dir, remove_probes
from asyncrl.log import get_logger
from asyncrl.processes import tail

logger = get_logger(__name__)


def start_roles(run: RayRun) -> None:
    check_shared_storage(run)
    endpoints = choose_endpoints(run)
    servers = run.of("infer")
    sections = inference_sections(run.config, endpoints)
    for member, section in zip(servers, sections, strict=True):
        member.url = f"http://{url_host(section.host)}:{section.port}"
        run.start(member, "infer", role_yaml(section), {})
    run.write_roles()
    wait_servers_healthy(run)
    logger.info("rl: %d inference server(s) ready: %s", len(servers),
                ", ".join(str(m.url) for m in servers))  # fmt: skip
    trainer = trainer_section(run.config, endpoints)
    world_size = run.config.trainer.world_size
    for member in sorted(run.of("train"), key=lambda m: m.rank or 0):
        assert member.rank is not None
        env = rank_environment(member.rank, world_size, endpoints) if world_size > 1 else {}
        run.start(member, "train", role_yaml(trainer), env)
    orchestrator = orchestrator_section(run.config, endpoints)
    run.start(run.of("orch")[0], "orch", role_yaml(orchestrator), {})
    run.write_roles()


def choose_endpoints(run: RayRun) -> Endpoints:
    """Where each role listens: loopback on a local instance, the node's address on a
    cluster, on ports free on that node."""

    def host(member: Member) -> str:
        return str(member.place["address"]) if run.on_cluster else LOOPBACK

    servers = run.of("infer")
    ports = run.call_all(servers, lambda m: m.actor.free_ports.remote(1))
    orchestrator = run.of("orch")[0]
    rank0 = next(m for m in run.of("train") if m.rank == 0)
    zmq = run.config.orchestrator.rollout_transport.type == "zmq"
    rollout_port = run.ray.get(orchestrator.actor.free_ports.remote(1))[0] if zmq else None
    master_port, broadcast_port = run.ray.get(rank0.actor.free_ports.remote(2))
    nccl = run.config.trainer.weight_broadcast.type == "nccl"
    return Endpoints(
        servers=[(host(m), ports[m.label][0]) for m in servers],
        orchestrator_host=host(orchestrator),
        rollout_port=rollout_port,
        trainer_host=host(rank0),
        master_port=master_port,
        broadcast_port=broadcast_port if nccl else None,
    )


def check_shared_storage(run: RayRun) -> None:
    """Every actor writes a probe into the run directory and looks for everyone else's."""
    probes = str(probe_dir(run.output, run.run_id))
    tokens = {m.label: secrets.token_hex(8) for m in run.members}
    try:
        write_errors = run.call_all(
            run.members, lambda m: m.actor.write_probe.remote(probes, tokens[m.label])
        )
        unseen = run.call_all(run.members, lambda m: m.actor.missing_probes.remote(probes, tokens))
    finally:  # on every node (a node-local run directory too), then here
        run.call_all(run.members, lambda m: m.actor.remove_probe.remote(probes))
        remove_probes(run.output, run.run_id)
    judge_shared_storage(run.config, run.output, write_errors, unseen)


def wait_servers_healthy(run: RayRun) -> None:
    deadline = time.monotonic() + run.config.ray.startup_timeout
    waiting = list(run.of("infer"))
    while waiting:
        run.stream_logs()
        check_exits(run)
        ready = run.call_all(waiting, lambda m: m.actor.healthy.remote(m.url))
        waiting = [m for m in waiting if not ready[m.label]]
        if waiting and time.monotonic() > deadline:
            raise RoleFailed(
                f"{waiting[0].describe()} not healthy after "
                f"{run.config.ray.startup_timeout:g} s; end of its log:\n"
                f"{tail(run.log_path(waiting[0]))}"
            )
        time.sleep(0.5)


def check_exits(run: RayRun) -> dict[str, int | None]:
    """At start-up: any role that exits stops the run."""
    codes = run.call_all(run.members, lambda m: m.actor.poll.remote())
    for member in run.members:
        code = codes[member.label]
        if code not in (None, 0) or (member.role == "infer" and code == 0):
            run.stream_logs()
            what = f"exited with code {code}" if code else "stopped before training ended"
            raise RoleFailed(
                f"{member.describe()} {what}; end of "
                f"{run.log_path(member)}:\n{tail(run.log_path(member))}"
            )
    return codes
