"""Transport settings shared by the orchestrator and the trainer (they must agree)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from asyncrl.config.base import StrictModel


class RolloutTransportConfig(StrictModel):
    type: Literal["filesystem", "zmq"] = Field("filesystem", description="`filesystem` or `zmq`.")
    host: str = Field("localhost", description="(zmq) Bind host.")
    port: int = Field(5555, ge=1, le=65535, description="(zmq) Bind port.")
    hwm: int = Field(10, gt=0, description="(zmq) High-water mark (max queued messages).")


def _a_transport_name(name: str) -> str:
    """A built-in's name or an import path; what the path names is checked when a role opens
    it (importing the user's module is that role's business, not the config loader's)."""
    if name not in BUILT_IN_WEIGHT_TRANSPORTS and ":" not in name:
        raise ValueError(
            f"{name!r}: `filesystem`, `nccl`, or the import path of a weight transport "
            "(`package.module:TRANSPORT`)"
        )
    return name


BUILT_IN_WEIGHT_TRANSPORTS = ("filesystem", "nccl")
# how weights travel from the trainer to the servers (`asyncrl.transport.weights`)
WeightTransportName = Annotated[str, AfterValidator(_a_transport_name)]


class WeightBroadcastConfig(StrictModel):
    type: WeightTransportName = Field(
        "filesystem",
        description="`filesystem` (checkpoint directories), `nccl` (torch.distributed; gloo on "
        "CPU; full weights only), or `package.module:TRANSPORT` (your own, see "
        "docs/architecture.md).",
    )
    host: str = Field("localhost", description="(nccl) Rendezvous host.")
    port: int = Field(29501, ge=1, le=65535, description="(nccl) Rendezvous port.")
    timeout: float = Field(1200, gt=0, description="(nccl) Timeout in seconds.")
    inference_world_size: int = Field(
        1, ge=1, description="(nccl) Number of inference servers receiving the weights."
    )
    delta: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Send a full-weights version as what changed since the version before "
        "(the XOR of each changed tensor's bits, compressed) to servers that hold that one; "
        "others get the full version. `auto`: when the servers serve a narrower dtype than the "
        "trainer holds (bfloat16 of float32 weights changes few values a step) and the delta "
        "is under half the full size; `on`: always; `off`: never. LoRA sends its adapter.",
    )
    served_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="The dtype the servers serve in, which the trainer's per-tensor checksums "
        "and deltas are made at (`asyncrl rl` sets it from `inference.dtype`; `auto` resolves "
        "as the servers' `dtype: auto` does on this machine). A server serving another dtype "
        "still checks what it loads, and gets full versions.",
    )

    @field_validator("delta", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        """YAML 1.1 reads a bare `on`/`off` as a boolean."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
