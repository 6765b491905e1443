"""Data-parallel training on N ranks with FSDP2, computing exactly what one process computes.

One process per device (`trainer.world_size`, the seeds' `gpus`), started by torch's own
launcher (`torch.distributed.run`); NCCL on GPUs, gloo on CPUs. The contract with the loop in
`train.py`:

- **Data.** Rank 0 receives batch s and broadcasts its msgpack bytes (never a pickle); every
  rank then holds the whole batch, so the loss normalisers (tokens, sequences, the dr_grpo
  constant) are computed from the whole step on every rank — the global values, with no
  reduction needed. Samples are split across ranks balanced by token count
  (`split_by_tokens`), and each rank packs its share into micro-batches as one process would.
- **Gradients.** Each rank's loss is its part of a sum normalised over the whole step, so the
  step's gradient is the *sum* of the ranks' gradients: FSDP's reduce-scatter divides by 1,
  not by the world size. Ranks run the same number of forward/backward passes (FSDP's
  collectives pair up across ranks); a rank with fewer micro-batches runs zero-weight passes.
- **Sharding.** `fully_shard` on every decoder layer and on the root. `zero_level` 3 reshards
  parameters after forward (ZeRO-3); 2 keeps them gathered until backward (ZeRO-2); 1 runs as 2
  (FSDP2 shards gradients too: never more memory than ZeRO-1, the same traffic).
- **Weights out.** `full_state_dict` gathers one parameter at a time onto rank 0's CPU memory;
  the other ranks never hold more than the parameter being gathered.

The GPU path (NCCL, one device per local rank) is written but not run here: this project's
machines have no GPU. Everything else runs on CPU with gloo in the tests.
"""

from __future__ import annotations

import os
import resource
import signal
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from asyncrl.config.trainer import TrainerConfig
from asyncrl.lifetime import die_with_parent
from asyncrl.log import get_logger
from asyncrl.trainer.logprobs import completion_logprobs, register_fsdp_logprobs
from asyncrl.trainer.model import precision_context
from asyncrl.trainer.packing import PackedBatch
from asyncrl.trainer.rank_store import rank_store

logger = get_logger(__name__)


@dataclass(frozen=True)
class Ranks:
    """This process's place among the trainer's ranks."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


SINGLE_PROCESS = Ranks(0, 1, torch.device("cpu"))


def init_ranks(world_size: int, timeout: float) -> Ranks:
    """Join the process group a launcher set up (RANK, WORLD_SIZE, MASTER_ADDR in the
    environment) through the ranks' own store (`rank_store.py`: bound to MASTER_ADDR, keyed by
    the run's secret); a single process when `world_size` is 1. Every collective times out
    after `timeout` seconds, so a dead rank is an error, never a silent hang."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if world_size == 1:
        return Ranks(0, 1, device)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != world_size:
        raise RuntimeError(
            f"trainer.world_size is {world_size} but the launcher started {launched} rank(s); "
            "`asyncrl train` starts the ranks itself, or give torchrun a matching total"
        )
    die_with_parent(signal.SIGKILL)  # never outlive the launcher, even stopped (SIGSTOP)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":  # GPU path: written, not run on this project's CPU machines
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    rank = int(os.environ["RANK"])
    dist.init_process_group(
        backend, store=rank_store(rank, world_size, timeout), rank=rank, world_size=world_size,
        timeout=timedelta(seconds=timeout), device_id=_device_id(device),
    )  # fmt: skip
    ranks = Ranks(dist.get_rank(), dist.get_world_size(), device)
    logger.info("trainer: rank %d of %d on %s (%s)", ranks.rank, world_size, device, backend)
    return ranks


def _device_id(device: torch.device) -> torch.device | None:
    return device if device.type == "cuda" else None


PEER_WAIT_S = 120  # how long a rank that finished waits for the others before closing anyway


def close_ranks(ranks: Ranks, wait_for_peers: bool = False) -> None:
    """Close the process group. `wait_for_peers` (a rank that finished its work): first meet
    every other rank, so no rank tears its group down while a peer's last messages to it are
    in flight — gloo aborted a rank that did (`terminate called without an active exception`,
    seen once under heavy CPU contention). On a failure path the others may never arrive: no
    wait there."""
    if not (ranks.distributed and dist.is_initialized()):
        return
    if wait_for_peers:
        try:
            if ranks.device.type == "cuda":
                dist.barrier()
            else:
                dist.monitored_barrier(timeout=timedelta(seconds=PEER_WAIT_S))
        except RuntimeError as error:  # a peer gone: close anyway, said once
            logger.warning("trainer: rank %d closes without its peers: %s", ranks.rank, error)
    dist.destroy_process_group()


def shard_model(
    model: torch.nn.Module, ranks: Ranks, zero_level: int, recipe: str
) -> torch.nn.Module:
    """FSDP2 on every decoder layer and on the root; the step's gradient is summed over ranks.
    `bf16`: parameters all-gathered in bfloat16, gradients reduced in float32, float32 master
    weights and optimizer state — the single-process bf16 recipe's numbers."""
    if not ranks.distributed:
        return model
    mesh = init_device_mesh(ranks.device.type, (ranks.world_size,))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if recipe == "bf16"
        else MixedPrecisionPolicy()
    )
    reshard = zero_level >= 3
    layer_classes = set(getattr(_base(model), "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"found no decoder layers to shard in {type(_base(model)).__name__}")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    # the root's own parameters (embeddings, norm, head) are needed again at once in backward
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    register_fsdp_logprobs(model)
    return model


def _base(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def split_by_tokens(lengths: list[int], world_size: int) -> list[list[int]]:
    """Sample indices per rank, balanced by token count: longest first, each to the rank with
    the fewest tokens so far (ties to the lowest rank). Deterministic, so every rank computes
    the same split; each rank's indices are in batch order."""
    shares: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        lightest = min(range(world_size), key=lambda r: (loads[r], r))
        shares[lightest].append(index)
        loads[lightest] += lengths[index]
    return [sorted(share) for share in shares]


def full_state_dict(model: torch.nn.Module, ranks: Ranks) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on rank 0 (CPU), None on the other ranks. Parameters are
    gathered one at a time; only rank 0 keeps them."""
    if not ranks.distributed:
        return None
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return state if ranks.is_main else None


def plain_float(value: torch.Tensor | float) -> float:
    """A float from a scalar that may be a DTensor (a gradient norm under FSDP)."""
    if isinstance(value, DTensor):
        value = value.full_tensor()
    return float(value)


def reduce_sums(values: dict[str, float], ranks: Ranks) -> dict[str, float]:
    """The sum over ranks of each value (float64, so token counts stay exact)."""
    return _reduce(values, ranks, dist.ReduceOp.SUM)


def reduce_max(values: dict[str, float], ranks: Ranks) -> dict[str, float]:
    return _reduce(values, ranks, dist.ReduceOp.MAX)


def _reduce(values: dict[str, float], ranks: Ranks, op: dist.ReduceOp) -> dict[str, float]:
    if not ranks.distributed or not values:
        return dict(values)
    names = sorted(values)
    tensor = torch.tensor([values[n] for n in names], dtype=torch.float64, device=ranks.device)
    dist.all_reduce(tensor, op=op)
    return dict(zip(names, tensor.tolist(), strict=True))


def gather_per_rank(values: dict[str, float], ranks: Ranks) -> dict[str, list[float]]:
    """Each value from every rank, in rank order (one small all-gather)."""
    names = sorted(values)
    mine = torch.tensor([values[n] for n in names], dtype=torch.float64, device=ranks.device)
    if not ranks.distributed:
        return {name: [float(mine[i])] for i, name in enumerate(names)}
    everyone = [torch.empty_like(mine) for _ in range(ranks.world_size)]
    dist.all_gather(everyone, mine)
    return {name: [float(t[i]) for t in everyone] for i, name in enumerate(names)}


def peak_memory_bytes(device: torch.device) -> float:
    """Peak memory of this process so far: allocated GPU memory on CUDA, resident set on CPU."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: KiB


def barrier(ranks: Ranks) -> None:
    if ranks.distributed:
        dist.barrier()


def zero_weight_pass(model: torch.nn.Module, config: TrainerConfig, device: torch.device) -> None:
    """A forward and backward pass that adds exactly zero to every gradient: it keeps this
    rank's FSDP collectives paired with the ranks that still have micro-batches."""
    dummy = PackedBatch(
        input_ids=torch.zeros(1, 2, dtype=torch.long, device=device),
        position_ids=torch.arange(2, device=device).unsqueeze(0),
        loss_mask=torch.tensor([[False, True]], device=device),
        sample_index=torch.zeros(1, 2, dtype=torch.long, device=device),
    )
    with precision_context(config.recipe, device):
        logprobs = completion_logprobs(model, dummy).logprobs
    (logprobs.sum() * 0.0).backward()
