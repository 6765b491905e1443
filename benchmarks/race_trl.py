"""TRL's GRPOTrainer on an asyncrl environment, as one contestant of `rl_vs_trl.py`.

Run as a subprocess by the race (never imported by asyncrl): the clock is the race's, from the
moment it started this process, so TRL's imports and model load count as asyncrl's start-up
does. Every `--every` steps the policy's weights are saved (as asyncrl keeps its broadcasts),
with the time since launch; the save is timed and reported apart. A callback times each step's
parts: generation, scoring, the rest of preparing the batch, training. Stops at `--budget`
seconds since launch. Writes `snapshots.json`, `decomposition.json` and TRL's own per-step
metrics (`log_history.json`: reward, entropy, frac_reward_zero_std) into `--out`. The loss
(`--loss-type`, `--epsilon`, `--epsilon-high`) is the workload's, mapped by the race to TRL's name,
and so are LoRA's rank, alpha and target modules (`--lora-rank`; snapshots are then adapters).
An environment whose examples end at a stop string (`stop_at_answer`) has TRL's `generate` stop
there too (transformers' `stop_strings`, which keeps the string, as asyncrl's servers are asked
to); a stopped row is padded with the pad token, which must be an EOS: TRL's loss keeps that
first EOS as the completion's end (asyncrl's sample ends at the stop, with no token after it)
and masks the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, TrainerCallback

from asyncrl.envs.base import score
from asyncrl.envs.registry import load_environment

LAUNCHED = float(os.environ.get("RACE_LAUNCHED_AT", time.time()))  # wall clock at launch


def since_launch() -> float:
    return time.time() - LAUNCHED


class Spans:
    """Seconds per part, summed over steps; one step's record on each `close_step`."""

    def __init__(self) -> None:
        self.current: defaultdict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.step_started = time.perf_counter()

    def timed(self, name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.current[name] += time.perf_counter() - started

        return wrapper

    def close_step(self) -> None:
        now = time.perf_counter()
        record = dict(self.current)
        record["step"] = now - self.step_started
        self.steps.append(record)
        self.current.clear()
        self.step_started = now


class RaceCallback(TrainerCallback):  # type: ignore[misc]
    """Snapshots every `every` steps, spans per step, and the stop at the budget."""

    def __init__(self, spans: Spans, out: Path, every: int, budget: float) -> None:
        self.spans, self.out, self.every, self.budget = spans, out, every, budget
        self.snapshots: list[dict[str, Any]] = []
        self.optimizer_started = time.perf_counter()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
        self.optimizer_started = time.perf_counter()
        return control

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
        self.spans.current["optimizer"] += time.perf_counter() - self.optimizer_started
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> Any:
        step = state.global_step
        if step % self.every == 0:
            started = time.perf_counter()
            target = self.out / "snapshots" / f"step_{step}"
            model.save_pretrained(target)
            self.snapshots.append({"step": step, "seconds": since_launch(), "path": str(target)})
            self.spans.current["snapshot"] += time.perf_counter() - started
        self.spans.close_step()
        if since_launch() >= self.budget:
            control.should_training_stop = True
        return control


def stop_like_asyncrl(trainer: Any, tokenizer: Any, examples: list[Any]) -> None:
    """The examples' stop strings (one set for all) in TRL's generation: `generate` needs the
    tokenizer to find them, which TRL does not pass, so the policy's `generate` is given it."""
    stops = {(example.stop, example.stop_kept) for example in examples}
    if stops == {((), False)}:
        return
    kept = len(stops) == 1 and next(iter(stops))[1]
    if not kept or tokenizer.pad_token_id not in trainer.eos_token_ids:
        raise SystemExit("race_trl: only one kept stop set, with the pad token an EOS, is raced")
    ((stop, _),) = stops
    trainer.generation_config.stop_strings = list(stop)
    generate = trainer.model.generate
    trainer.model.generate = lambda *a, **k: generate(*a, tokenizer=tokenizer, **k)


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--sft", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--env", default="reverse-text")
    parser.add_argument("--env-args", default="{}", help="the environment's args, as JSON")
    parser.add_argument("--budget", type=float, required=True, help="seconds since launch")
    parser.add_argument("--every", type=int, required=True, help="steps between snapshots")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=32, help="completions per step")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--mask-truncated", action="store_true",
        help="leave completions cut at --max-tokens out of the loss (the workload's "
        "orchestrator.mask_truncated_completions)",
    )  # fmt: skip
    parser.add_argument("--examples", type=int, default=20_000, help="training prompts drawn")
    parser.add_argument(
        "--loss-type", choices=["grpo", "dr_grpo", "dapo"], default="grpo",
        help="TRL's name of the workload's loss (rl_vs_trl.TRL_LOSSES maps asyncrl's)",
    )  # fmt: skip
    parser.add_argument("--epsilon", type=float, default=0.2)
    parser.add_argument("--epsilon-high", type=float, default=None)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning")
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--lora-targets", nargs="*", default=[])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--logging-steps", type=int, default=10,
        help="steps between TRL's own metric records (reward, entropy, frac_reward_zero_std: "
        "tied groups), kept in `log_history.json`",
    )  # fmt: skip
    return parser


def main() -> None:
    args = parser().parse_args()
    # TRL and its datasets are the race's venv's (`make bench-setup`), not asyncrl's: imported
    # here, so that the command line can be checked where they are not installed
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    env = load_environment(args.env, json.loads(args.env_args))
    examples = env.examples("train", args.examples)
    dataset = Dataset.from_list([{"prompt": e.prompt, "index": i} for i, e in enumerate(examples)])

    def reward(completions: list[Any], index: list[int], **_: Any) -> list[float]:
        return [
            score(env, completion[0]["content"], examples[position])
            for completion, position in zip(completions, index, strict=True)
        ]

    reward.__name__ = env.rubric[0].name
    config = GRPOConfig(
        output_dir=str(out / "trl"), use_cpu=True, bf16=args.bf16, gradient_checkpointing=False,
        learning_rate=args.lr, lr_scheduler_type="constant", weight_decay=0.0,
        max_grad_norm=1.0, per_device_train_batch_size=args.batch,
        num_generations=args.group, max_completion_length=args.max_tokens,
        temperature=args.temperature, top_k=0, top_p=1.0, beta=0.0, loss_type=args.loss_type,
        epsilon=args.epsilon, epsilon_high=args.epsilon_high,
        mask_truncated_completions=args.mask_truncated,
        scale_rewards="none", num_iterations=1, max_steps=1_000_000,
        logging_steps=args.logging_steps,
        save_strategy="no", report_to="none", seed=args.seed, data_seed=args.seed,
    )  # fmt: skip
    spans = Spans()
    callback = RaceCallback(spans, out, args.every, args.budget)
    peft_config = None
    if args.lora_rank:  # the workload's adapters: same rank, alpha and target modules
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
            target_modules=args.lora_targets, task_type="CAUSAL_LM",
        )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(args.sft)
    trainer = GRPOTrainer(
        model=args.sft, reward_funcs=reward, args=config, train_dataset=dataset,
        processing_class=tokenizer, callbacks=[callback], peft_config=peft_config,
    )  # fmt: skip
    stop_like_asyncrl(trainer, tokenizer, examples)
    # the parts of a step: generation and scoring inside the batch's preparation, the rest of
    # that preparation (logprobs, advantages), and the training step around it
    trainer._generate = spans.timed("generate", trainer._generate)
    trainer._calculate_rewards = spans.timed("score", trainer._calculate_rewards)
    trainer._generate_and_score_completions = spans.timed(
        "prepare", trainer._generate_and_score_completions
    )
    trainer.training_step = spans.timed("training_step", trainer.training_step)
    trainer.train()
    (out / "snapshots.json").write_text(json.dumps(callback.snapshots))
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))
    (out / "decomposition.json").write_text(
        json.dumps({"threads": torch.get_num_threads(), "steps": spans.steps})
    )


if __name__ == "__main__":
    main()
