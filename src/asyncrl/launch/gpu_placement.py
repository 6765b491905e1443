"""Which GPUs each role of `asyncrl rl` (local launcher) sees: one `CUDA_VISIBLE_DEVICES` per
role process, so a trainer on GPU 1 and a server on GPU 0 each find their device as `cuda:0`.

Without this every role would take the first visible GPU (the trainer's `model.cuda()`, the
server's default device) and a two-GPU machine would run both on GPU 0. The ids in `gpu_ids`
are positions among the GPUs the launcher itself sees, so `CUDA_VISIBLE_DEVICES=2,3 asyncrl rl`
with `gpu_ids.trainer: [1]` gives the trainer physical GPU 3, as CUDA itself would number them.
Left unset, the split follows the deployment:

- colocated: the trainer (which serves inference itself) gets every visible GPU;
- disaggregated on one GPU: the server and trainer share it (lower the server's
  `gpu_memory_utilization`);
- disaggregated on several: the trainer gets the last `trainer.world_size` GPUs and the server,
  and the judge if any, the others (a world size that leaves the server none is refused).

The orchestrator never touches a GPU: it gets none. Its reward models (`env[].model_rewards`
with `device: cuda`) run in processes of their own, which do: they get `gpu_ids.reward_model`,
else the server's GPUs, handed to the orchestrator as `$ASYNCRL_SCORER_DEVICES` and given to
each scorer process as its CUDA_VISIBLE_DEVICES (`scorer_process.scorer_environment`). Pure over
plain data, so every machine's case is tested on a machine without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from asyncrl.config.base import ConfigError
from asyncrl.config.model_rewards import SCORER_DEVICES_ENV
from asyncrl.gpu_presence import gpu_count

VISIBLE = "CUDA_VISIBLE_DEVICES"


class GPUPlacementError(ConfigError):
    """`gpu_ids` asks for what this machine cannot give; the message names the key (the
    command says it in one line and exits 2, as for any config error)."""


@dataclass(frozen=True)
class Placement:
    roles: dict[str, list[str]]  # role -> the device ids it sees, in the launcher's numbering
    reason: str  # one line for the launcher's log


def visible_gpus(environ: Mapping[str, str] | None = None, count: int | None = None) -> list[str]:
    """The GPUs this launcher sees: `CUDA_VISIBLE_DEVICES` as given (ids or UUIDs), else
    `0 … count-1` (`count`: torch's device count when not given)."""
    environ = os.environ if environ is None else environ
    if VISIBLE in environ:
        return [device.strip() for device in environ[VISIBLE].split(",") if device.strip()]
    if count is None:
        count = gpu_count()
    return [str(index) for index in range(count)]


def place_gpus(
    deployment: str,
    visible: Sequence[str],
    wanted: Mapping[str, list[int] | None],
    trainer_ranks: int = 1,
    judge: bool = False,
    reward_models: Sequence[tuple[str, str]] = (),
) -> Placement:
    """The devices of `infer`, `train`, `judge` (when `judge`) and `reward_model` (when
    `reward_models`, (name, device) of the terms that ask for a GPU, is not empty), from the
    ids the config asked for (`wanted`: role -> positions among `visible`, or None) and the
    deployment."""
    roles = ["train"] + ([] if deployment == "colocated" else ["infer"]) + (["judge"] * judge)
    roles += ["reward_model"] if reward_models else []
    for role, ids in wanted.items():
        if ids is None:
            continue
        key = f"gpu_ids.{_KEYS[role]}"
        if deployment == "colocated" and role == "infer":
            raise GPUPlacementError(
                f"{key}: with `deployment: colocated` the trainer serves inference itself; "
                "give its GPUs in gpu_ids.trainer"
            )
        if not visible:
            raise GPUPlacementError(f"{key} is {ids}, but this machine shows no CUDA device")
        outside = [i for i in ids if not 0 <= i < len(visible)]
        if outside:
            raise GPUPlacementError(
                f"{key}: {outside} not among the {len(visible)} GPU(s) visible here "
                f"(ids count from 0 among CUDA_VISIBLE_DEVICES={','.join(visible)})"
            )
        if len(set(ids)) != len(ids):
            raise GPUPlacementError(f"{key}: {ids} names a GPU twice")
    trainer_ids = wanted.get("train")
    if trainer_ids is not None and len(trainer_ids) < trainer_ranks:
        raise GPUPlacementError(
            f"gpu_ids.trainer: {len(trainer_ids)} GPU(s) for trainer.world_size {trainer_ranks} "
            "(each rank takes one)"
        )
    if reward_models and not visible:
        name, device = reward_models[0]
        raise GPUPlacementError(
            f"env[].model_rewards `{name}` asks for device {device}, but this machine shows no "
            "CUDA device: use `device: cpu`"
        )
    if not visible:
        return Placement({}, "no CUDA device: every role on the CPU")
    chosen, reason = _default_split(deployment, list(visible), trainer_ranks)
    devices = {}
    for role in roles:
        ids = wanted.get(role)
        shares_the_servers = role in ("judge", "reward_model")
        source = chosen["infer" if shares_the_servers else role] if ids is None else ids
        devices[role] = [visible[i] for i in source]
    for name, device in reward_models:  # `cuda` or `cuda:N` (the config checks the form)
        if int(device.partition(":")[2] or 0) >= len(devices["reward_model"]):
            raise GPUPlacementError(
                f"env[].model_rewards `{name}`: device {device}, but its process sees "
                f"{len(devices['reward_model'])} GPU(s) (gpu_ids.reward_model, else the "
                "inference server's; cuda:N counts among them)"
            )
    explicit = [f"gpu_ids.{_KEYS[r]}" for r in roles if wanted.get(r) is not None]
    if explicit:
        reason = f"set in the config ({', '.join(explicit)})"
    return Placement(devices, reason)


_KEYS = {"infer": "inference", "train": "trainer", "judge": "judge", "reward_model": "reward_model"}


def _default_split(
    deployment: str, visible: list[str], trainer_ranks: int
) -> tuple[dict[str, list[int]], str]:
    everything = list(range(len(visible)))
    if deployment == "colocated":
        if trainer_ranks > len(visible):
            raise GPUPlacementError(
                f"trainer.world_size {trainer_ranks} needs a GPU per rank; {len(visible)} visible"
            )
        return {"train": everything, "infer": everything}, "colocated: the trainer takes them all"
    if len(visible) == 1 and trainer_ranks == 1:
        return {"train": [0], "infer": [0]}, "one GPU: server and trainer share it"
    if trainer_ranks > len(visible) - 1:
        raise GPUPlacementError(
            f"trainer.world_size {trainer_ranks} needs a GPU per rank beside the server's; "
            f"{len(visible)} visible: lower the world size or set gpu_ids.trainer and "
            "gpu_ids.inference to share GPUs"
        )
    split = len(visible) - trainer_ranks
    trainer_count = trainer_ranks
    return (
        {"infer": everything[:split], "train": everything[split:]},
        f"{len(visible)} GPUs: the trainer takes the last {trainer_count}, the server the rest",
    )


def role_environment(placement: Placement, role: str) -> dict[str, str]:
    """What the role's process gets: its devices, none for the orchestrator (but the devices of
    its reward models' processes, when it has any on a GPU), nothing at all on a machine
    without GPUs (the user's own CUDA_VISIBLE_DEVICES then stays as it was)."""
    if not placement.roles:
        return {}
    env = {VISIBLE: ",".join(placement.roles.get(role, []))}
    if role == "orch" and "reward_model" in placement.roles:
        env[SCORER_DEVICES_ENV] = ",".join(placement.roles["reward_model"])
    return env
