"""`asyncrl export`: a run's weights as a model directory any tool loads with no other argument.

A run's broadcasts hold what the servers load: full weights with the model's config but no
tokenizer, or, for LoRA, a PEFT adapter that needs its base. Here the adapter is merged onto
its base (in float32, then cast), and the tokenizer with its chat template and the generation
config are written beside the weights, so `AutoModelForCausalLM.from_pretrained(dir)`, vLLM
and `asyncrl eval --model dir` take the directory as it is. The directory is written whole
(a reader never sees half of it); a tied LM head stays tied.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml

from asyncrl.config.base import ConfigError
from asyncrl.config.export import ExportConfig
from asyncrl.fs import atomic_directory
from asyncrl.log import get_logger
from asyncrl.run.layout import BROADCAST_STABLE, broadcasts_dir, config_file, run_dir
from asyncrl.step_dirs import step_dirs

logger = get_logger(__name__)


def broadcast_of(source: Path) -> Path:
    """`source` itself when it is a complete broadcast, else the newest one under it (a run
    directory, or an output directory holding `run_default`)."""
    if (source / BROADCAST_STABLE).is_file():
        return source
    for root in (broadcasts_dir(source), broadcasts_dir(run_dir(source))):
        complete = [path for _, path in step_dirs(root) if (path / BROADCAST_STABLE).is_file()]
        if complete:
            return complete[-1]
    raise ConfigError(
        f"source: {source} is not a broadcast (no {BROADCAST_STABLE} marker) and holds no complete "
        "broadcasts/step_N"
    )


def run_model(broadcast: Path) -> str | None:
    """The `model` of the run a broadcast belongs to (`<output_dir>/configs/train.yaml`)."""
    output_dir = broadcast.parent.parent.parent  # <output_dir>/run_default/broadcasts/step_N
    train_yaml = config_file(output_dir, "train")  # the trainer's, as `asyncrl rl` wrote it
    if not train_yaml.is_file():
        return None
    model = (yaml.safe_load(train_yaml.read_text()) or {}).get("model")
    return str(model) if model else None


def base_of(config: ExportConfig, broadcast: Path, adapter: dict | None) -> str | None:
    if config.base_model:
        return config.base_model
    return run_model(broadcast) or (adapter or {}).get("base_model_name_or_path")


def merged_model(config: ExportConfig, broadcast: Path) -> tuple[torch.nn.Module, str | None]:
    """The broadcast's model, a LoRA adapter merged onto its base; and the base's path."""
    from transformers import AutoModelForCausalLM

    adapter_file = broadcast / "adapter_config.json"
    adapter = json.loads(adapter_file.read_text()) if adapter_file.is_file() else None
    base = base_of(config, broadcast, adapter)
    trust = config.trust_remote_code
    if adapter is None:
        model = AutoModelForCausalLM.from_pretrained(broadcast, dtype=torch.float32,
                                                     trust_remote_code=trust)  # fmt: skip
        return model, base
    if not base:
        raise ConfigError(
            f"{broadcast} is a LoRA adapter and no base model is known: set base_model"
        )
    from peft import PeftModel

    logger.info("export: merging the LoRA adapter %s onto %s", broadcast, base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, trust_remote_code=trust)
    return PeftModel.from_pretrained(model, str(broadcast)).merge_and_unload(), base


def export(config: ExportConfig) -> Path:
    """Write the model directory `config.output_dir`; returns it."""
    from transformers import AutoTokenizer, GenerationConfig

    broadcast = broadcast_of(Path(config.source))
    model, base = merged_model(config, broadcast)
    tokenizer_source = config.tokenizer or base
    if tokenizer_source is None:
        raise ConfigError(f"no tokenizer for {broadcast}: set tokenizer (or base_model)")
    trust = config.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=trust)
    dtype = config.dtype
    if dtype == "auto":  # the dtype the base (or a full broadcast) was saved in
        from transformers import AutoConfig

        saved = AutoConfig.from_pretrained(
            base if (broadcast / "adapter_config.json").is_file() else broadcast,
            trust_remote_code=config.trust_remote_code,
        ).dtype
        dtype = str(saved or "float32").removeprefix("torch.")
    model = model.to(getattr(torch, dtype))
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    generation = None
    for where in (broadcast, base):
        try:
            generation = GenerationConfig.from_pretrained(where)
            break
        except (OSError, TypeError, ValueError):
            continue
    with atomic_directory(config.output_dir) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if generation is not None:
            generation.save_pretrained(staging)
        (staging / "asyncrl_export.json").write_text(json.dumps(
            {"source": str(broadcast.resolve()), "base_model": base, "dtype": dtype}, indent=1
        ))  # fmt: skip
    logger.info("export: %s -> %s (%s)", broadcast, config.output_dir, dtype)
    return Path(config.output_dir)


def run_export(config: ExportConfig) -> None:
    print(export(config), file=sys.stdout)
