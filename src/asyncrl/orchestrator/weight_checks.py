"""Whether a server holds the weights the orchestrator believes it holds, and how often it did
not at first.

After each load a server answers with what it loaded: the trainer's fingerprint it checked
the weights against (`verified`), and how many times it had to read a version again
(`weight_reloads`). The pool takes a server for work only when `verified` is the fingerprint of
the broadcast it asked for; a server whose weights arrived another way (NCCL, a colocated
trainer) must report, for its version, the fingerprint in that version's marker. The counts
go into every batch's metrics:

- `orchestrator/weight_mismatch_reloads`: versions read again because what a server got was not
  the trainer's (reported by the servers, plus the loads this pool asked for again);
- `orchestrator/weight_delta_loads`, `orchestrator/weight_full_loads` and
  `orchestrator/weight_bytes_read`: how versions travelled from the files to the servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncrl.log import get_logger
from asyncrl.orchestrator.generation import Server
from asyncrl.transport.broadcast import Broadcast
from asyncrl.transport.weights.manifest import MANIFEST_FILE

logger = get_logger(__name__)


class WeightsNotServed(RuntimeError):
    """A server that, loaded twice, does not hold the version asked for (or refused it as not
    the trainer's): the run stops, naming the server, the version and what differed."""


@dataclass
class WeightCounters:
    mismatch_reloads: int = 0
    delta_loads: int = 0
    full_loads: int = 0
    bytes_read: int = 0

    def take(self) -> dict[str, float]:
        """The counts since the last batch, then zero."""
        metrics = {
            "orchestrator/weight_mismatch_reloads": float(self.mismatch_reloads),
            "orchestrator/weight_delta_loads": float(self.delta_loads),
            "orchestrator/weight_full_loads": float(self.full_loads),
            "orchestrator/weight_bytes_read": float(self.bytes_read),
        }
        self.mismatch_reloads = self.delta_loads = self.full_loads = self.bytes_read = 0
        return metrics

    def record(self, server: Server, info: dict[str, Any] | None) -> None:
        """A load's answer: how it travelled, and the server's reloads since the last answer."""
        if not info:
            return
        if info.get("loaded") == "delta":
            self.delta_loads += 1
        elif info.get("loaded") == "full":
            self.full_loads += 1
        self.bytes_read += int(info.get("bytes_read") or 0)
        seen_reloads(self, server, info)


def seen_reloads(counters: WeightCounters, server: Server, info: dict[str, Any]) -> None:
    """Add the reloads a server reports since it last did (its counter restarts with it)."""
    reloads = int(info.get("weight_reloads") or 0)
    if reloads > server.reloads_seen:
        counters.mismatch_reloads += reloads - server.reloads_seen
    server.reloads_seen = reloads


def checkable(broadcast: Broadcast) -> bool:
    """Files with the trainer's manifest (a trainer from before manifests wrote none)."""
    return not broadcast.pushed and (broadcast.path / MANIFEST_FILE).exists()


def load_problem(broadcast: Broadcast, info: dict[str, Any] | None) -> str | None:
    """Why a server's answer to loading `broadcast` does not show it holds it; None when it
    does, or when the engine cannot say (SGLang; a broadcast without a manifest)."""
    if info is None or "verified" not in info or not checkable(broadcast):
        return None
    verified = info["verified"]
    if verified == broadcast.fingerprint:
        return None
    return (
        f"it reports weights checked against {verified} (version {info.get('version')}), "
        f"not the trainer's {broadcast.fingerprint} of version {broadcast.step}"
    )


def pushed_problem(server: Server, marker: Broadcast | None) -> str | None:
    """Why a server's own report of its version (weights pushed to it) does not match that
    version's marker; None when it does or nothing can be compared (no marker yet, a LoRA
    version, whose marker is the adapter's)."""
    if marker is None or marker.kind not in ("full", "nccl") or server.reported is None:
        return None
    if marker.step != server.version:
        return None
    if server.reported == marker.fingerprint:
        return None
    return (
        f"it holds weights of fingerprint {server.reported} as version {server.version}, whose "
        f"marker says {marker.fingerprint}"
    )


def warn(server: Server, problem: str, action: str) -> None:
    logger.warning("%s: %s; %s", server.root, problem, action)
