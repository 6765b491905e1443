"""`asyncrl eval`: score a model on an environment's held-out split.

Generation here is a plain batched `model.generate` in this process, enough for the tiny
models the quick start uses and independent of any server.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from asyncrl.config.eval import EvalRunConfig
from asyncrl.envs import Environment, Example, load_environment, score
from asyncrl.log import get_logger

logger = get_logger(__name__)


@dataclass(frozen=True)
class EvalResult:
    mean_reward: float
    rewards: list[float]
    completions: list[str]


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
        prompts = [
            tokenizer.apply_chat_template(
                example.prompt, tokenize=False, add_generation_prompt=True
            )
            for example in examples[start : start + batch_size]
        ]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        output = model.generate(
            **encoded,
            max_new_tokens=max_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
        )
        new_tokens = output[:, encoded["input_ids"].shape[1] :]
        completions.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    return completions


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
) -> EvalResult:
    was_training = model.training
    model.eval()
    examples = [
        example
        for example in env.examples("eval", num_examples)
        for _ in range(rollouts_per_example)
    ]
    completions = generate_completions(
        model,
        tokenizer,
        examples,
        max_tokens=max_tokens,
        temperature=temperature,
        batch_size=batch_size,
        seed=seed,
    )
    rewards = [
        score(env, text, example) for text, example in zip(completions, examples, strict=True)
    ]
    model.train(was_training)
    return EvalResult(statistics.fmean(rewards), rewards, completions)


def run_eval(config: EvalRunConfig) -> EvalResult:
    tokenizer = AutoTokenizer.from_pretrained(
        config.tokenizer or config.model, trust_remote_code=config.trust_remote_code
    )
    model = AutoModelForCausalLM.from_pretrained(
        config.model, dtype=torch.float32, trust_remote_code=config.trust_remote_code
    )
    env = load_environment(config.env.id, config.env.args)
    result = evaluate(
        model,
        tokenizer,
        env,
        num_examples=config.num_examples,
        rollouts_per_example=config.rollouts_per_example,
        temperature=config.temperature,
        max_tokens=config.max_tokens,
        batch_size=config.batch_size,
        seed=config.seed,
    )
    mode = "greedy" if config.temperature == 0 else f"temperature {config.temperature}"
    logger.info(
        "%s on %d held-out %s prompts (%s): mean reward %.4f",
        config.model,
        config.num_examples,
        env.name,
        mode,
        result.mean_reward,
    )
    return result
