"""Transport settings shared by the orchestrator and the trainer (they must agree)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import StrictModel


class RolloutTransportConfig(StrictModel):
    type: Literal["filesystem", "zmq"] = Field("filesystem", description="`filesystem` or `zmq`.")
    host: str = Field("localhost", description="(zmq) Bind host.")
    port: int = Field(5555, ge=1, le=65535, description="(zmq) Bind port.")
    hwm: int = Field(10, gt=0, description="(zmq) High-water mark (max queued messages).")


class WeightBroadcastConfig(StrictModel):
    type: Literal["filesystem", "nccl"] = Field(
        "filesystem",
        description="`filesystem` (checkpoint directories) or `nccl` (torch.distributed; gloo "
        "on CPU). nccl sends full weights only.",
    )
    host: str = Field("localhost", description="(nccl) Rendezvous host.")
    port: int = Field(29501, ge=1, le=65535, description="(nccl) Rendezvous port.")
    timeout: float = Field(1200, gt=0, description="(nccl) Timeout in seconds.")
    inference_world_size: int = Field(
        1, ge=1, description="(nccl) Number of inference servers receiving the weights."
    )
