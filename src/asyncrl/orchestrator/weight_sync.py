"""The orchestrator's side of the weight protocol: bring every server to the weights a step
needs, and no further than the trainer has published.

The trainer publishes version s as `broadcasts/step_s/` (marked `STABLE` last), or, colocated,
hands it to its engine in memory. Before generating for batch s the orchestrator needs every
server that is up at version ≥ s − 1 − k; it loads the newest complete broadcast into the
servers that lack it, sleeps until the next one appears (inotify) or a server reports new
weights (a long-polled `/weight_info`), and gives up after `ckpt.wait_for_weights_timeout`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.file_arrival import RECHECK_S, ArrivalWatch
from asyncrl.log import get_logger
from asyncrl.orchestrator.client import ClientPool
from asyncrl.run.layout import broadcast_dir, broadcasts_dir
from asyncrl.transport.broadcast import (
    Broadcast,
    broadcasts_in_use,
    latest_broadcast,
    read_broadcast,
)
from asyncrl.transport.served_base import read_served_base
from asyncrl.waiting import Wait

logger = get_logger(__name__)

LORA_NAME = "asyncrl-policy"


class WeightSync:
    def __init__(self, config: OrchestratorConfig, run_dir: Path, clients: ClientPool) -> None:
        assert config.model.name is not None  # the config refuses a missing model.name
        self.config, self.run_dir, self.clients = config, run_dir, clients
        # the model name requests ask for: the adapter's once a LoRA broadcast is loaded
        self.request_model = config.model.name
        self.broadcast_watch = ArrivalWatch()  # wakes `sync` when weights are out

    async def sync(self, need: int) -> None:
        """Load the newest complete broadcast; block until every server that is up holds
        version ≥ need (at most `ckpt.wait_for_weights_timeout` seconds). While it
        waits it also asks the servers: a colocated trainer hands them weights without a
        broadcast. A server back from a restart gets the newest weights before any work, and
        servers whose weights a restarted trainer withdrew go back to its newest broadcast. A
        server whose pushed weights are not its version's (the marker's fingerprint) takes no
        work until they are."""
        timeout = self.config.ckpt.wait_for_weights_timeout
        key = "orchestrator.ckpt.wait_for_weights_timeout"
        wait = Wait(f"weights version {need} from the trainer", logger, timeout, key=key)
        base_wait = Wait(f"the trainer's served base in {self.run_dir}", logger, timeout, key=key)
        asked = False
        while True:
            if not asked or self.clients.oldest_version() < need:  # a cheap GET, every 50 ms
                await self.clients.refresh_versions()
                self.clients.hold_back_mismatched(self.marker_of)
                asked = True
            await self.clients.revive()  # servers that were down and answer again
            if not await self.hold_trainer_base():  # not published yet: the trainer is starting
                base_wait.check()
                await asyncio.sleep(0.05)
                continue
            async with broadcasts_in_use(self.run_dir):  # the trainer must not prune it meanwhile
                broadcast = latest_broadcast(self.run_dir)
                if broadcast is not None and (servers := self.clients.needing(broadcast)):
                    await self.clients.load(broadcast, LORA_NAME, servers)
                    if broadcast.kind == "lora" and not broadcast.pushed:
                        self.request_model = LORA_NAME
            self.clients.mark_up(broadcast)  # servers back from a restart with the newest weights
            if self.clients.oldest_version() >= need:
                return
            wait.check()
            await self.weights_may_change()

    def marker_of(self, step: int) -> Broadcast | None:
        """Version `step`'s record in the broadcasts (None: none, or not readable yet)."""
        try:
            return read_broadcast(broadcast_dir(self.run_dir, step))
        except ValueError:
            return None

    async def weights_may_change(self) -> None:
        """Sleep until a broadcast appears (inotify on `broadcasts/`) or a server reports
        weights it was handed without one (a long-polled /weight_info), at most RECHECK_S:
        the next step's generation starts the moment its weights exist."""
        self.broadcast_watch.aim(broadcasts_dir(self.run_dir))
        arrivals = asyncio.ensure_future(self.broadcast_watch.sleep_async(RECHECK_S))
        pushed = asyncio.ensure_future(self.clients.version_change(RECHECK_S))
        done, pending = await asyncio.wait([arrivals, pushed], return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()  # an error in either is a bug: let it surface

    async def hold_trainer_base(self) -> bool:
        """With `load_trainer_base`, every server that takes work holds the base the trainer
        published (loaded where missing: at the start, after a server restarts), so adapters
        apply to it; False while there is none yet."""
        if not self.config.load_trainer_base:
            return True
        base = read_served_base(self.run_dir)
        if base is None:
            return False
        await self.clients.load_served_base(base)
        return True

    def close(self) -> None:
        self.broadcast_watch.close()
