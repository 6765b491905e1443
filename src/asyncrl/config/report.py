"""Where a run's records go besides `metrics.jsonl`: W&B, TensorBoard (`report_to` of `rl`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from asyncrl.config.base import StrictModel

Tracker = Literal["wandb", "tensorboard"]


class ReportConfig(StrictModel):
    """`report_to: [wandb, tensorboard]`, or this section (the seeds' W&B keys, plus `trackers`;
    a section without `trackers` means W&B)."""

    trackers: list[Tracker] = Field(
        default_factory=lambda: ["wandb"], description="Trackers to send the run to."
    )
    project: str = Field("asyncrl", description="W&B project name.")
    name: str | None = Field(None, description="Run name (null = the output directory's name).")
    offline: bool = Field(
        False, description="W&B offline mode (no account needed; also `WANDB_MODE=offline`)."
    )
    samples: bool = Field(True, description="Log tables of prompts, completions and rewards.")
    interval: int = Field(
        10, gt=0, description="Steps between sample tables (the orchestrator writes them)."
    )
    tensorboard_dir: str | None = Field(
        None, description="TensorBoard event directory (null = `<run dir>/tensorboard`)."
    )

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, data: Any) -> Any:
        """`report_to: [wandb, tensorboard]` is the short form of `{trackers: [...]}`."""
        return {"trackers": data} if isinstance(data, list) else data
