"""Placing a Ray run: one placement group for the whole run, one `RoleActor` per bundle, named
after the machines it lands on; the trainer's ranks ordered by node address, then device; one
restart budget per unit that restarts together."""

from __future__ import annotations

from asyncrl.launch.placement import Node, address_key, explain_unplaceable, plan_slots
from asyncrl.launch.placement import rank_order as order_ranks
from asyncrl.launch.ray_auth import explain_unborn_actor
from asyncrl.launch.ray_run import Member, RayRun, unit_of
from asyncrl.launch.role_actor import RoleActor
from asyncrl.launch.roles import RoleFailed
from asyncrl.launch.supervisor import RestartBudget, why_not_restartable


def reserve(run: RayRun) -> None:
    """One placement group for the whole run, then one actor per bundle."""
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    settings = run.config.ray
    slots = plan_slots(run.config)
    run.placement_group = placement_group(
        [slot.resources for slot in slots],
        strategy=settings.strategy,
        name=f"asyncrl-{run.run_id}",
    )
    try:
        run.ray.get(run.placement_group.ready(), timeout=settings.placement_timeout)
    except run.ray.exceptions.GetTimeoutError:
        raise RoleFailed(
            explain_unplaceable(
                slots, live_nodes(run), settings.strategy, settings.placement_timeout
            )
        ) from None
    node_addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in run.ray.nodes()}
    table = placement_group_table(run.placement_group)
    bundle_address = {
        int(b): node_addresses.get(node, "") for b, node in table["bundles_to_node_id"].items()
    }
    remote_actor = run.ray.remote(RoleActor)
    # replicas and rank candidates numbered by node address, so the names follow the machines
    for role in ("infer", "orch", "train"):
        bundles = [b for b, slot in enumerate(slots) if slot.role == role]
        bundles.sort(key=lambda b: (address_key(bundle_address[b]), b))
        for number, bundle in enumerate(bundles):
            slot = slots[bundle]
            label = "orch" if role == "orch" else f"{role}-{number}"
            ray_name = f"asyncrl-{run.run_id}-{label}"
            options = remote_actor.options(
                name=ray_name,
                num_cpus=slot.resources.get("CPU", 0.0),
                num_gpus=slot.resources.get("GPU", 0.0),
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    run.placement_group, placement_group_bundle_index=bundle
                ),
            )
            member = Member(label, slot, None, ray_name)
            try:
                member.actor = options.remote(label)
            except run.ray.exceptions.RaySystemError as error:
                # the cluster already gave up on this driver (an earlier actor was destroyed):
                # Ray cancels the creation itself, "Actor creation cancelled"
                raise RoleFailed(
                    f"{member.describe()} died before it ran.\n"
                    f"{explain_unborn_actor(error, run.auth, run.ray)}"
                ) from None
            run.members.append(member)
    # the first call waits for every actor's worker process (and its runtime_env) to start
    places = run.call_all(
        run.members, lambda m: m.actor.place.remote(), timeout=settings.startup_timeout
    )
    for member in run.members:
        member.place = places[member.label]
    assign_ranks(run)
    make_budgets(run)
    run.write_roles()


def make_budgets(run: RayRun) -> None:
    """One restart budget per inference replica, for the orchestrator, and for the trainer
    (its ranks restart together)."""
    for member in run.members:
        unit = unit_of(member)
        what = "the trainer's ranks" if unit == "train" else member.describe()
        run.budgets.setdefault(unit, RestartBudget(
            what, run.config.restart, why_not_restartable(member.role, run.config)
        ))  # fmt: skip


def live_nodes(run: RayRun) -> list[Node]:
    """The live nodes; what is free now is known per node only on a one-node cluster."""
    alive = [n for n in run.ray.nodes() if n.get("Alive")]
    free = run.ray.available_resources() if len(alive) == 1 else None
    return [Node(n["NodeManagerAddress"], dict(n["Resources"]), free) for n in alive]


def assign_ranks(run: RayRun) -> None:
    """Ranks by node address, then device: the same cluster gives the same ranks."""
    ranks = [m for m in run.members if m.role == "train"]
    order = order_ranks([(m.place["address"], m.place["devices"]) for m in ranks])
    for rank, position in enumerate(order):
        ranks[position].rank = rank
        ranks[position].label = f"train-{rank}"
