"""Which bundles a Ray run asks for, the order its actors take, and why a request cannot be placed.

Pure functions over plain data, so they are tested without a cluster: `ray.py` feeds them what
Ray reports (the placement-group table, `ray.nodes()`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from asyncrl.config.rl import RLConfig


@dataclass(frozen=True)
class Slot:
    """One bundle of the placement group and the role that runs in it."""

    role: str  # "infer" | "orch" | "train"
    index: int  # replica or rank-candidate number within the role
    resources: dict[str, float]  # Ray resource name -> amount, zeros left out

    @property
    def label(self) -> str:
        return "orch" if self.role == "orch" else f"{self.role}-{self.index}"


@dataclass(frozen=True)
class Node:
    address: str
    total: dict[str, float]  # what the node has
    available: dict[str, float] | None = None  # what is free now, where Ray says per node


def _resources(cpus: float, gpus: float) -> dict[str, float]:
    return {name: amount for name, amount in (("CPU", cpus), ("GPU", gpus)) if amount > 0}


def plan_slots(config: RLConfig) -> list[Slot]:
    """Inference replicas first, then the orchestrator, then one bundle per trainer rank."""
    ray = config.ray
    slots = [
        Slot("infer", i, _resources(ray.inference.cpus, ray.inference.gpus))
        for i in range(ray.inference.replicas)
    ]
    slots.append(Slot("orch", 0, _resources(ray.orchestrator.cpus, 0)))
    slots += [
        Slot("train", i, _resources(ray.trainer.cpus, ray.trainer.gpus))
        for i in range(config.trainer.world_size)
    ]
    return slots


def address_key(address: str) -> tuple[int, int | str]:
    """Sort IP addresses numerically (10.0.0.9 before 10.0.0.10), anything else by name."""
    try:
        return (0, int(ipaddress.ip_address(address)))
    except ValueError:
        return (1, address)


def rank_order(places: Sequence[tuple[str, Sequence[str]]]) -> list[int]:
    """Positions of `places` ((node address, device ids)) in rank order: by node address, then
    device, then position, so the same cluster gives the same ranks on every run."""

    def key(position: int) -> tuple[tuple[int, int | str], list[int | str], int]:
        address, devices = places[position]
        return address_key(address), [_device_key(d) for d in devices], position

    return sorted(range(len(places)), key=key)


def _device_key(device: str) -> int | str:
    return int(device) if str(device).isdigit() else str(device)


def _fits(need: Mapping[str, float], have: Mapping[str, float]) -> bool:
    return all(have.get(name, 0.0) >= amount for name, amount in need.items())


def _show(resources: Mapping[str, float]) -> str:
    shown = [
        f"{name} {amount:g}"
        for name, amount in sorted(resources.items())
        if not name.startswith(("node:", "memory", "object_store"))
    ]
    return ", ".join(shown) or "nothing"


def explain_unplaceable(
    slots: Sequence[Slot], nodes: Sequence[Node], strategy: str, timeout: float
) -> str:
    """Why the placement group was not ready in time, naming the bundles no node can hold."""
    lines = [f"Ray could not place the run's {len(slots)} bundles ({strategy}) in {timeout:g} s."]
    impossible = [
        (position, slot)
        for position, slot in enumerate(slots)
        if not any(_fits(slot.resources, node.total) for node in nodes)
    ]
    for position, slot in impossible:
        lines.append(
            f"  bundle {position} ({slot.label}: {_show(slot.resources)}) fits no node of the "
            "cluster"
        )
    if not impossible:
        lines.append(
            "  every bundle fits some node on its own, but not all together: the cluster is "
            "busy or too small for this strategy"
        )
    lines.append(f"  the cluster has {len(nodes)} node(s):")
    for node in sorted(nodes, key=lambda n: address_key(n.address)):
        free = "" if node.available is None else f" (free now: {_show(node.available)})"
        lines.append(f"    {node.address}: {_show(node.total)}{free}")
    return "\n".join(lines)
