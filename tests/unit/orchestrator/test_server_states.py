"""Which servers take work and which get weights, as servers go down and come back: a server
back from a restart takes no work until it holds the newest weights, and weights a restarted
trainer withdrew are replaced by its newest broadcast."""

from __future__ import annotations

import asyncio
from pathlib import Path

from asyncrl.config.orchestrator import ClientConfig
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.generation import RequestRejected, ServerError
from asyncrl.transport.broadcast import Broadcast


def pool_with(*servers: tuple[str, int]) -> ClientPool:
    pool = ClientPool(ClientConfig(base_url=[f"http://h{i}:1/v1" for i in range(len(servers))]))
    for server, (state, version) in zip(pool.servers, servers, strict=True):
        server.state, server.version = state, version  # type: ignore[assignment]
    return pool


def broadcast(step: int, pushed: bool = False, fingerprint: str = "f") -> Broadcast:
    return Broadcast(step, "full", fingerprint, Path(f"/b/step_{step}"), pushed)


def test_only_servers_that_are_up_take_work_and_set_the_oldest_version() -> None:
    pool = pool_with(("up", 5), ("down", 0), ("back", 0))
    pool.servers[0].in_flight = 10
    assert pool.least_loaded() is pool.servers[0]
    assert pool.oldest_version() == 5
    assert pool_with(("down", 3)).oldest_version() == -1


def test_servers_behind_back_from_a_restart_or_on_withdrawn_weights_need_the_broadcast() -> None:
    pool = pool_with(("up", 4), ("up", 3), ("up", 5), ("back", 4), ("down", 0))
    assert [pool.servers.index(s) for s in pool.needing(broadcast(4))] == [1, 2, 3]


def test_a_step_the_restarted_trainer_redid_replaces_the_withdrawn_one_of_the_same_number() -> None:
    """The server held step 4 of the dead trainer's future; the restarted one resumed from 2
    and published its own step 4 before the pool saw broadcast 2."""
    pool = pool_with(("up", 4), ("up", 4), ("up", 4), ("up", 4))
    withdrawn, redone = broadcast(4, fingerprint="dead"), broadcast(4, fingerprint="redone")
    for server, fingerprint in zip(pool.servers, ["dead", "redone", None], strict=False):
        server.fingerprint = fingerprint
    assert [pool.servers.index(s) for s in pool.needing(redone)] == [0]
    assert [pool.servers.index(s) for s in pool.needing(withdrawn)] == [1]
    assert pool.needing(broadcast(4, pushed=True, fingerprint="redone")) == []


def test_a_server_ahead_of_a_pushed_broadcast_keeps_its_weights() -> None:
    """A colocated trainer pushes every step but writes files only every `save_steps`."""
    pool = pool_with(("up", 7))
    assert pool.needing(broadcast(4, pushed=True)) == []


def test_a_server_back_takes_work_once_marked_up() -> None:
    pool = pool_with(("back", 4), ("down", 0))
    pool.mark_up(broadcast(4))
    assert [server.state for server in pool.servers] == ["up", "down"]


def test_a_server_back_waits_for_weights_the_trainer_pushes_itself() -> None:
    """Over NCCL the orchestrator cannot load weights into a restarted server: the trainer
    sends them once it lets the server back into its group."""
    pool = pool_with(("back", 0), ("back", 5), ("up", 5))
    pool.mark_up(broadcast(5, pushed=True))
    assert [server.state for server in pool.servers] == ["back", "up", "up"]
    assert pool.oldest_version() == 5


class AnswersWithErrors:
    """A server's engine API whose weights-version calls come back as errors (a 5xx after the
    retries, a 4xx), as `generation.request` raises them."""

    async def version(self) -> int:
        raise ServerError("http://h0:1/weight_info failed with 500 on every attempt: boom")

    async def version_change(self, known: int, timeout: float) -> int:
        raise RequestRejected("http://h0:1/weight_info", 400, "no such thing")


def test_a_server_that_cannot_say_which_weights_it_holds_is_marked_down_not_the_run_stopped() -> (
    None
):
    pool = pool_with(("up", 3), ("up", 3))
    for server in pool.servers:
        server.api = AnswersWithErrors()  # type: ignore[assignment]
    asyncio.run(pool.refresh_versions())
    assert [server.state for server in pool.servers] == ["down", "down"]
    pool = pool_with(("up", 3), ("down", 0))
    pool.servers[0].api = AnswersWithErrors()  # type: ignore[assignment]
    asyncio.run(pool.version_change(timeout=0.1))
    assert [server.state for server in pool.servers] == ["down", "down"]
