"""One GRPO update, asyncrl's trainer against TRL's, on the same batch and the same weights.

The races compare two whole systems; where asyncrl learned less per sample early in a run
(benchmarks/RESULTS.md, issue 59) the cause could be the update itself or what each system
samples. This isolates the update: one LoRA model (SmolLM2-135M-Instruct, the quick start's
adapters, the B matrices given small random values so that every adapter weight has a
gradient), one batch of the quick start's shape (4 chain_sum prompts × 8 completions of at most
32 tokens sampled at 0.7 by HF `generate` from that model, ended at the template's EOS as both
systems end them, each scored by the task's own scorer), the quick start's advantages (reward
minus its group's mean, `scale_rewards: none`), then

- asyncrl: the batch as the orchestrator sends it (`TrainingSample`s: the EOS trained, the
  sampler's logprobs), the trainer's micro-batches (shared prompts, 8 rows a pass) and its own
  `train_step` (logprobs, `grpo_clip`, gradient clipping, the fused AdamW of
  `build_optimizer`);
- TRL: `GRPOTrainer._compute_loss` on the same tokens as its own batch preparation lays them out
  (left-padded prompts, completions masked after the first EOS), `loss_type="grpo"`, backward,
  clipping and its Trainer's optimizer;

and compares the gradients each optimizer stepped with (relative L2 difference, cosine, norms)
and the weights the step left (AdamW, lr 2e-4, gradient norm 1). Prints
one JSON line. Needs TRL: run it with the race's environment.

    PYTHONPATH=src .venv-bench/bin/python benchmarks/update_vs_trl.py \
        --model models/smollm2-135m-instruct [--seeds 4]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from asyncrl.config.trainer import TrainerConfig
from asyncrl.config.training import TrainingConfig
from asyncrl.envs.base import score
from asyncrl.envs.reasoning_gym_tasks import ReasoningGymEnv
from asyncrl.trainer.loss import loss_named
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.trainer.model import attention_implementation
from asyncrl.trainer.optim import build_optimizer, build_scheduler
from asyncrl.trainer.train import train_step
from asyncrl.types import TrainingBatch, TrainingSample
from machine import cpu_name

TEMPERATURE, MAX_TOKENS, PROMPTS, GROUP, LR = 0.7, 32, 4, 8, 2e-4
QUICK_START_ENV = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "answer_format": "tag",
    "system_prompt": "You are a calculator. Write the calculation, then the result in answer "
    "tags, like this:\n3 + 4 = 7\n<answer>7</answer>",
}


def lora_model(path: Path, seed: int) -> torch.nn.Module:
    """The quick start's adapters (asyncrl's defaults: rank 16, alpha 32, its target modules)
    with B drawn small instead of 0, so that A has a gradient too."""
    defaults = TrainingConfig(model=str(path))
    base = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=attention_implementation(dense_mask=True)
    )
    base.config.use_cache = False
    model = get_peft_model(
        base,
        LoraConfig(
            r=defaults.lora_rank,
            lora_alpha=defaults.lora_alpha,
            lora_dropout=0.0,
            target_modules=defaults.lora_target_modules,
            task_type="CAUSAL_LM",
        ),
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 1e-3)
    return model


@torch.no_grad()
def sampled_batch(
    model: torch.nn.Module, tokenizer: AutoTokenizer, seed: int
) -> tuple[list[list[int]], list[list[int]], list[float]]:
    """PROMPTS × GROUP completions at TEMPERATURE, each cut after its first EOS, and rewards."""
    env = ReasoningGymEnv("chain_sum", **QUICK_START_ENV)
    examples = env.examples("eval", PROMPTS + seed * PROMPTS)[seed * PROMPTS :]
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    prompts, completions, rewards = [], [], []
    for example in examples:
        ids = list(
            tokenizer.apply_chat_template(example.prompt, add_generation_prompt=True)["input_ids"]
        )
        output = model.generate(
            input_ids=torch.tensor([ids] * GROUP),
            attention_mask=torch.ones(GROUP, len(ids)),
            do_sample=True,
            temperature=TEMPERATURE,
            top_k=0,
            top_p=1.0,
            max_new_tokens=MAX_TOKENS,
            pad_token_id=eos,
        )[:, len(ids) :].tolist()
        for row in output:
            completion = row[: row.index(eos) + 1] if eos in row else row
            prompts.append(ids)
            completions.append(completion)
            text = tokenizer.decode(completion, skip_special_tokens=True)
            rewards.append(float(score(env, text, example)))
    return prompts, completions, rewards


def advantages_of(rewards: list[float]) -> list[float]:
    out = []
    for start in range(0, len(rewards), GROUP):
        group = rewards[start : start + GROUP]
        mean = sum(group) / len(group)
        out += [r - mean for r in group]
    return out


def lora_gradient(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])


def lora_weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters() if p.requires_grad])


def asyncrl_step(model, tokenizer, path, prompts, completions, advantages) -> torch.Tensor:
    """asyncrl's trainer on the batch: the orchestrator's samples, the trainer's micro-batches
    and its own `train_step` (logprobs, `grpo_clip`, clipping, AdamW); returns the gradient
    the optimizer stepped with."""
    with torch.no_grad():  # the sampler's logprobs: the model's own (on policy)
        inference = []
        for prompt, completion in zip(prompts, completions, strict=True):
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
            logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / TEMPERATURE, dim=-1)
            inference.append(logp.gather(1, torch.tensor(completion)[:, None])[:, 0].tolist())
    samples = [
        TrainingSample(
            prompt_ids=prompt,
            completion_ids=completion,
            completion_mask=[True] * len(completion),
            inference_logprobs=logprobs,
            advantages=[advantage] * len(completion),
            policy_versions=[0] * len(completion),
            temperature=TEMPERATURE,
            env="chain_sum",
        )
        for prompt, completion, logprobs, advantage in zip(
            prompts, completions, inference, advantages, strict=True
        )
    ]
    config = TrainerConfig(
        model=str(path), optimizer="adamw", recipe="fp32", learning_rate=LR,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
        loss={"type": "grpo_clip"},
    )  # fmt: skip
    micro_batches = build_micro_batches(
        TrainingBatch(step=1, samples=samples, max_tokens=MAX_TOKENS),
        sequence_len=256,
        rows_per_micro_batch=8,
        pad_token_id=tokenizer.pad_token_id,
        normalisation=loss_named("grpo_clip").normalisation,
        shared_prefix=True,
        loss_config=config.loss,
    )
    optimizer = build_optimizer(model, config)
    stepped_with: list[torch.Tensor] = []  # the gradient `train_step` clipped and stepped with
    optimizer.register_step_pre_hook(lambda *_: stepped_with.append(lora_gradient(model)))
    train_step(model, None, optimizer, build_scheduler(optimizer, config, 1), micro_batches,
               config, version=0)  # fmt: skip
    assert len(stepped_with) == 1
    return stepped_with[0]


def trl_trainer(model, tokenizer, out: Path) -> GRPOTrainer:
    config = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        learning_rate=LR,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        loss_type="grpo",
        scale_rewards="none",
        num_iterations=1,
        report_to="none",
        save_strategy="no",
    )
    dataset = Dataset.from_list([{"prompt": "unused"}] * (PROMPTS * GROUP))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda **_: [0.0],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def trl_backward(trainer, tokenizer, prompts, completions, advantages) -> None:
    """TRL's loss on the batch as its `_generate_and_score_completions` lays it out."""
    pad = tokenizer.pad_token_id
    width = max(map(len, prompts))
    prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    longest = max(map(len, completions))
    completion_ids = torch.tensor([c + [pad] * (longest - len(c)) for c in completions])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (longest - len(c)) for c in completions])
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": completion_mask.sum(),
    }
    trainer.model.train()
    trainer._compute_loss(trainer.model, inputs).backward()


def one_seed(path: Path, seed: int, out: Path) -> dict[str, float]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    ours = lora_model(path, seed)
    theirs = copy.deepcopy(ours)  # the same adapters: peft draws A from the global generator
    prompts, completions, rewards = sampled_batch(ours, tokenizer, seed)
    advantages = advantages_of(rewards)
    before = lora_weights(ours)
    g_ours = asyncrl_step(ours, tokenizer, path, prompts, completions, advantages).double()
    trainer = trl_trainer(theirs, tokenizer, out / f"trl-{seed}")
    assert torch.equal(before, lora_weights(trainer.model))
    trl_backward(trainer, tokenizer, prompts, completions, advantages)
    parameters = [p for p in trainer.model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)  # as TRL's Trainer does before its step
    g_theirs = lora_gradient(trainer.model).double()
    trainer.create_optimizer()
    trainer.optimizer.step()
    d_ours = (lora_weights(ours) - before).double()
    d_theirs = (lora_weights(trainer.model) - before).double()
    return {
        "seed": seed,
        "completion_tokens": sum(map(len, completions)),
        "groups_with_signal": sum(
            len(set(rewards[i : i + GROUP])) > 1 for i in range(0, len(rewards), GROUP)
        ),
        "grad_norm_asyncrl": g_ours.norm().item(),
        "grad_norm_trl": g_theirs.norm().item(),
        "grad_rel_l2": ((g_ours - g_theirs).norm() / g_theirs.norm().clamp(min=1e-30)).item(),
        "grad_cosine": torch.nn.functional.cosine_similarity(g_ours, g_theirs, dim=0).item(),
        "update_rel_l2": ((d_ours - d_theirs).norm() / d_theirs.norm().clamp(min=1e-30)).item(),
        "update_norm_ratio": (d_ours.norm() / d_theirs.norm().clamp(min=1e-30)).item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("outputs/update_vs_trl"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = [one_seed(args.model, seed, args.out) for seed in range(args.seeds)]
    informative = [row for row in rows if row["groups_with_signal"]]  # a tied batch: no gradient
    worst = max((row["grad_rel_l2"] for row in informative), default=math.nan)
    line = {
        "benchmark": "update_vs_trl",
        "cpu": cpu_name(),
        "seeds": rows,
        "worst_grad_rel_l2": worst,
        "same_update": math.isfinite(worst) and worst < 1e-4,
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
