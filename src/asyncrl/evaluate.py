"""`asyncrl eval`: score models on an environment's held-out split.

A model is a Hugging Face directory, an RL broadcast (full weights, or a LoRA adapter merged
onto its base here), or a run directory, which stands for every broadcast it holds: one call
scores a run's checkpoints and prints a table. Generation is a plain batched `model.generate`
in this process, enough for the tiny models the quick start uses and independent of any
server; a multi-turn environment's episodes are played here too (`play_episodes.py`). With
`generator: engine` the embedded engine samples single-turn completions instead, in this
process too (`engine_completions.py`: the same distribution, in less time), its float32 linear
weights laid out as the server lays out its own (`inference/input_major.py`). The records are
those of online evaluation (`monitor/eval_records.py`).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from asyncrl.bitsandbytes_import import quiet_bitsandbytes_import
from asyncrl.config.base import ConfigError
from asyncrl.config.eval import EvalRunConfig
from asyncrl.engine_completions import engine_completions
from asyncrl.envs import Environment, Example, load_environment, score
from asyncrl.envs.multi_turn import is_multi_turn
from asyncrl.envs.plain_prompt import cut_at_stop
from asyncrl.inference.input_major import lay_out_input_major
from asyncrl.log import get_logger
from asyncrl.monitor.eval_records import summarize
from asyncrl.monitor.metrics import MetricsWriter
from asyncrl.play_episodes import play_episodes
from asyncrl.run.layout import broadcast_dir, broadcasts_dir
from asyncrl.step_dirs import step_of
from asyncrl.transport.broadcast import stable_steps

logger = get_logger(__name__)


@dataclass(frozen=True)
class EvalResult:
    mean_reward: float
    rewards: list[float]  # example-major: the k samples of example 0, then of example 1…
    completions: list[str]
    examples: list[Example]  # the held-out examples, each once, in order


@torch.no_grad()
def generate_completions(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    *,
    max_tokens: int,
    temperature: float,
    batch_size: int,
    seed: int,
) -> list[str]:
    """One completion per example, in order; greedy when temperature is 0."""
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    completions: list[str] = []
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        # a base model's plain prompt is tokenized as the server does a text prompt (with the
        # tokenizer's special tokens: Gemma's <bos>); a chat template writes its own
        plain = batch[0].prompt_text is not None
        prompts = [
            example.prompt_text
            if plain
            else tokenizer.apply_chat_template(
                example.prompt, tokenize=False, add_generation_prompt=True
            )
            for example in batch
        ]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=plain)
        output = model.generate(
            **encoded,
            max_new_tokens=max_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
            **_stopping(batch, tokenizer),
        )
        new_tokens = output[:, encoded["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        completions.extend(
            cut_at_stop(t, e.stop, kept=e.stop_kept) for t, e in zip(texts, batch, strict=True)
        )
    return completions


def _stopping(batch: list[Example], tokenizer: PreTrainedTokenizerBase) -> dict[str, object]:
    """Stop strings for `generate` when every example of the batch shares them: the batch ends
    once each row has written one, not at `max_tokens` (a base model never writes EOS). The rows
    are cut at the stop afterwards as before, and a finished row still draws its sample each
    step, so the other rows' tokens, and every completion, are what they were without it."""
    stops = {example.stop for example in batch}
    if len(stops) != 1 or not (stop := stops.pop()):
        return {}
    return {"stop_strings": list(stop), "tokenizer": tokenizer}


def evaluate(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    env: Environment,
    *,
    num_examples: int,
    rollouts_per_example: int = 1,
    temperature: float = 0.0,
    max_tokens: int = 64,
    batch_size: int = 64,
    seed: int = 0,
    generator: str = "hf",
) -> EvalResult:
    was_training = model.training
    model.eval()
    held_out = env.examples("eval", num_examples)
    examples = [example for example in held_out for _ in range(rollouts_per_example)]
    if is_multi_turn(env):  # scored on whole episodes; a completion is the model's turns
        episodes = play_episodes(
            model, tokenizer, env, examples, max_tokens=max_tokens, temperature=temperature,
            batch_size=batch_size, seed=seed,
        )  # fmt: skip
        rewards = [score(env, e, x) for e, x in zip(episodes, examples, strict=True)]
        completions = [
            "\n".join(m["content"] for m in episode if m["role"] == "assistant")
            for episode in episodes
        ]
        model.train(was_training)
        return EvalResult(statistics.fmean(rewards), rewards, completions, held_out)
    if generator == "engine":
        completions = engine_completions(
            model, tokenizer, examples, max_tokens=max_tokens, temperature=temperature, seed=seed
        )
    else:
        completions = generate_completions(
            model, tokenizer, examples, max_tokens=max_tokens, temperature=temperature,
            batch_size=batch_size, seed=seed,
        )  # fmt: skip
    rewards = [
        score(env, text, example) for text, example in zip(completions, examples, strict=True)
    ]
    model.train(was_training)
    return EvalResult(statistics.fmean(rewards), rewards, completions, held_out)


@dataclass(frozen=True)
class ScoredModel:
    label: str
    step: int | None  # of a broadcast
    result: EvalResult
    record: dict[str, Any]  # the eval/<env>/… record


def models_to_score(config: EvalRunConfig) -> list[Path | str]:
    """`model` then `models`, a run directory expanded into its broadcasts (step order; NCCL
    markers hold no weights and are skipped)."""
    expanded: list[Path | str] = []
    for name in [config.model, *config.models]:
        path = Path(name)
        if broadcasts_dir(path).is_dir():
            steps = [broadcast_dir(path, step) for step in stable_steps(path)]
            found = [d for d in steps if any(d.glob("*.safetensors"))]
            if not found:
                raise ValueError(f"{path}: no broadcast with weights to score")
            expanded.extend(found)
        else:
            expanded.append(path if path.exists() else name)
    return expanded


def load_policy(
    name: Path | str, base_model: str | None, tokenizer_name: str | None, trust: bool
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A model directory as is, or a PEFT adapter merged onto its base (in float32)."""
    adapter_config = Path(name) / "adapter_config.json"
    if adapter_config.exists():
        base = base_model or json.loads(adapter_config.read_text()).get("base_model_name_or_path")
        if not base:
            raise ValueError(f"{name}: a LoRA adapter without a base model; set `base_model`")
        model = AutoModelForCausalLM.from_pretrained(
            base, dtype=torch.float32, trust_remote_code=trust
        )
        with quiet_bitsandbytes_import():  # peft imports bitsandbytes where it is installed
            from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(name)).merge_and_unload()
        tokenizer_source = tokenizer_name or base
    else:
        model = AutoModelForCausalLM.from_pretrained(
            name, dtype=torch.float32, trust_remote_code=trust
        )
        tokenizer_source = tokenizer_name or str(name)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=trust)
    return model, tokenizer


def run_eval(config: EvalRunConfig) -> list[ScoredModel]:
    if config.env.address is not None:
        raise ConfigError("env.address: this command runs the environment here; leave it unset")
    env = load_environment(config.env.id, config.env.args)
    if config.generator == "engine" and is_multi_turn(env):
        raise ConfigError(
            f"generator: engine samples single-turn completions; `{config.env.id}` plays "
            "multi-turn episodes: use `generator: hf`"
        )
    scored: list[ScoredModel] = []
    for name in models_to_score(config):
        model, tokenizer = load_policy(
            name, config.base_model, config.tokenizer, config.trust_remote_code
        )
        if config.generator == "engine":  # the model is this process's own: its engine reads
            lay_out_input_major(model)  # the weights as the server's does (input_major.py)
        result = evaluate(
            model, tokenizer, env,
            num_examples=config.num_examples, rollouts_per_example=config.rollouts_per_example,
            temperature=config.temperature, max_tokens=config.max_tokens,
            batch_size=config.batch_size, seed=config.seed, generator=config.generator,
        )  # fmt: skip
        k = config.rollouts_per_example
        per_example = [
            [(reward, []) for reward in result.rewards[start : start + k]]
            for start in range(0, len(result.rewards), k)
        ]
        step = step_of(Path(name)) if isinstance(name, Path) else None
        record = summarize(env.name, per_example, config.pass_threshold, step or 0)
        record |= format_record(env, result, k)
        scored.append(ScoredModel(str(name), step, result, record))
        if config.metrics_file:
            MetricsWriter(config.metrics_file, role="eval").log(step or 0, record)
    mode = "greedy" if config.temperature == 0 else f"temperature {config.temperature}"
    logger.info("%d held-out %s prompts (%s)", config.num_examples, env.name, mode)
    return scored


def format_record(env: Environment, result: EvalResult, k: int) -> dict[str, float]:
    """`format@k` (share of samples giving an answer in the asked form) and
    `mean_if_formatted@k` (their mean reward), for environments that can tell
    (`formatted(completion, example)`): a gain in form is then told from one in skill."""
    formatted = getattr(env, "formatted", None)
    if formatted is None or not result.completions:
        return {}
    examples = [e for e in result.examples for _ in range(k)]
    shaped = [
        bool(formatted(text, example))
        for text, example in zip(result.completions, examples, strict=True)
    ]
    among = [reward for reward, ok in zip(result.rewards, shaped, strict=True) if ok]
    prefix = f"eval/{env.name}"
    return {
        f"{prefix}/format@{k}": statistics.fmean(shaped),
        f"{prefix}/mean_if_formatted@{k}": statistics.fmean(among) if among else 0.0,
    }


def table(scored: list[ScoredModel]) -> str:
    """One line per model: step, mean@k, best@k, pass@k."""
    if not scored:
        return ""
    keys = [key for key in scored[0].record if "@" in key]
    width = max(len(s.label) for s in scored)
    header = f"{'model':<{width}}  {'step':>5}  " + "  ".join(
        f"{k.split('/')[-1]:>8}" for k in keys
    )
    lines = [header]
    for item in scored:
        values = "  ".join(f"{item.record[k]:>8.4f}" for k in keys)
        step = "" if item.step is None else str(item.step)
        lines.append(f"{item.label:<{width}}  {step:>5}  {values}")
    return "\n".join(lines)
