"""Configuration of `asyncrl export`: a run's trained weights as a standalone model directory."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import StrictModel


class ExportConfig(StrictModel):
    source: str = Field(
        description="What to export: a broadcast (`<output_dir>/run_default/broadcasts/step_N`: "
        "full weights or a LoRA adapter), or a run directory or output directory (its newest "
        "broadcast)."
    )
    output_dir: str = Field(
        description="Where the model directory goes: a new or empty directory, or an earlier "
        "export holding nothing else (replaced whole); anything else there is refused, as is the "
        "source or a directory above it. A symbolic link is written through."
    )
    base_model: str | None = Field(
        None,
        description="The model a LoRA adapter is merged onto, and the tokenizer's source; null "
        "= the run's `model` (from `<output_dir>/configs/train.yaml`, for a broadcast in its "
        "run's `<output_dir>/run_<name>/broadcasts/step_N`), else the adapter's own "
        "`base_model_name_or_path`.",
    )
    tokenizer: str | None = Field(
        None, description="Where the tokenizer and chat template come from; null = the base."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights' dtype in the export; `auto` = the base model's own."
    )
    trust_remote_code: bool = Field(False, description="Allow custom model code of the base.")
