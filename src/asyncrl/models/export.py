"""`asyncrl export`: a run's weights as a model directory any tool loads with no other argument.

A run's broadcasts hold what the servers load: full weights with the model's config but no
tokenizer, or, for LoRA, a PEFT adapter that needs its base. Here the adapter is merged onto
its base (in float32, then cast), and the tokenizer with its chat template and the generation
config are written beside the weights, so `AutoModelForCausalLM.from_pretrained(dir)`, vLLM
and `asyncrl eval --model dir` take the directory as it is. The directory is written whole
(a reader never sees half of it); a tied LM head stays tied. An output that holds anything but
an earlier export, or holds what is exported, is refused (`fs.output_directory`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml

from asyncrl.bitsandbytes_import import quiet_bitsandbytes_import
from asyncrl.config.base import ConfigError
from asyncrl.config.export import ExportConfig
from asyncrl.fs import OutputRefused, output_directory, write_output_marker
from asyncrl.log import get_logger
from asyncrl.run.layout import (
    BROADCAST_STABLE,
    DEFAULT_RUN_NAME,
    broadcasts_dir,
    config_file,
    run_dir,
    run_name_of,
)
from asyncrl.step_dirs import step_dirs, step_of

logger = get_logger(__name__)

MARKER = "asyncrl_export.json"  # what the export was made from; marks an earlier export


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


def run_config(broadcast: Path) -> dict | None:
    """The trainer config of the run `broadcast` belongs to, found by the run layout: the
    broadcast is `<output_dir>/run_<name>/broadcasts/step_N` and `<output_dir>/configs/
    train.yaml` (as `asyncrl rl` wrote it) names the same run (`run_name: <name>`). None for
    a broadcast anywhere else: a copied or downloaded one says nothing of the directories
    above it."""
    broadcast = broadcast.resolve()
    run = broadcast.parent.parent
    name = run_name_of(run)
    if step_of(broadcast) is None or broadcast.parent != broadcasts_dir(run) or name is None:
        return None
    try:
        trainer = yaml.safe_load(config_file(run.parent, "train").read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(trainer, dict) or trainer.get("run_name", DEFAULT_RUN_NAME) != name:
        return None
    return trainer


def run_model(broadcast: Path) -> str | None:
    """The `model` of the run a broadcast belongs to; None outside a run's layout."""
    model = (run_config(broadcast) or {}).get("model")
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
            f"{broadcast} is a LoRA adapter and no base model is known (it is not in a run's "
            "`<output_dir>/run_<name>/broadcasts/step_N` with its configs/train.yaml, and its "
            "adapter_config.json names none): set base_model"
        )
    with quiet_bitsandbytes_import():  # peft imports bitsandbytes where it is installed
        from peft import PeftModel

    logger.info("export: merging the LoRA adapter %s onto %s", broadcast, base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, trust_remote_code=trust)
    return PeftModel.from_pretrained(model, str(broadcast)).merge_and_unload(), base


def export(config: ExportConfig) -> Path:
    """Write the model directory `config.output_dir`; returns it."""
    source = Path(config.source)
    broadcast = broadcast_of(source)
    adapter_file = broadcast / "adapter_config.json"
    adapter = json.loads(adapter_file.read_text()) if adapter_file.is_file() else None
    read_from = [source, broadcast, *(p for p in (base_of(config, broadcast, adapter),
                                                  config.tokenizer) if p)]  # fmt: skip
    with output_directory(config.output_dir, command="export", marker=MARKER,
                          sources=read_from) as staging:  # fmt: skip
        model, base, tokenizer, generation, dtype = _standalone(config, broadcast)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if generation is not None:
            generation.save_pretrained(staging)
        description = {"source": str(broadcast.resolve()), "base_model": base, "dtype": dtype}
        write_output_marker(staging, MARKER, description)
    logger.info("export: %s -> %s (%s)", broadcast, config.output_dir, dtype)
    return Path(config.output_dir)


def _standalone(
    config: ExportConfig, broadcast: Path
) -> tuple[torch.nn.Module, str | None, object, object | None, str]:
    """The merged model in the export's dtype, its base, the tokenizer, the generation config
    (None where neither the broadcast nor the base has one) and the dtype's name."""
    from transformers import AutoTokenizer, GenerationConfig

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
    return model, base, tokenizer, generation, dtype


def run_export(config: ExportConfig) -> None:
    try:
        path = export(config)
    except OutputRefused as error:  # said in one line, as a config error is
        raise ConfigError(str(error)) from error
    print(path, file=sys.stdout)
