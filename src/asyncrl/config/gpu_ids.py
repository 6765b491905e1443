"""Which GPUs each role of a local `asyncrl rl` sees (`launch/gpu_placement.py` applies it)."""

from __future__ import annotations

from pydantic import Field

from asyncrl.config.base import StrictModel

_IDS = (
    "Positions among the GPUs the launcher sees (CUDA_VISIBLE_DEVICES when set, else all), "
    "given to the role's process as its CUDA_VISIBLE_DEVICES; null = chosen by the deployment"
)


class GPUIdsConfig(StrictModel):
    inference: list[int] | None = Field(
        None, description=f"{_IDS} (several GPUs split the server's engine)."
    )
    trainer: list[int] | None = Field(
        None, description=f"{_IDS} (one per trainer rank; colocated: the server's too)."
    )
    judge: list[int] | None = Field(None, description=f"{_IDS} (null: the inference server's).")
    reward_model: list[int] | None = Field(
        None,
        description="The GPUs of the orchestrator's reward-model processes "
        "(`env[].model_rewards` with `device: cuda`; the orchestrator itself sees none), as "
        "positions among the GPUs the launcher sees, given to each such process as its "
        "CUDA_VISIBLE_DEVICES; null = the inference server's.",
    )

    def any_set(self) -> bool:
        return any(
            ids is not None for ids in (self.inference, self.trainer, self.judge, self.reward_model)
        )
