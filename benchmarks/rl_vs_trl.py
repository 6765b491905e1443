"""asyncrl against TRL's GRPOTrainer on reverse-text, on this machine, side by side in one run.

Both start from the same SFT checkpoint with the same task, reward (LCS ratio), group size,
completions per step, learning rate, optimizer (AdamW, constant schedule), precision (what
`recipe: auto` picks on this machine, for both: bf16 autocast over fp32 master weights where
bfloat16 is native, fp32 elsewhere), loss (clipped GRPO, ε = 0.2, each sequence's tokens averaged,
then the sequences: TRL's `loss_type="grpo"`), advantages r − mean(r) (TRL:
`scale_rewards="none"`), temperature 1.0 and max tokens: the settings of
`examples/reverse_text/rl.yaml`, which asyncrl runs as written but for the deployment. TRL gets
its best CPU setting (no gradient checkpointing). Each runs for `--budget` seconds of wall clock
from its own launch, start-up included; the weights are snapshotted every `--every` seconds and
scored afterwards on the held-out prompts with sampling at temperature 1.0.

asyncrl runs twice: disaggregated with max_async_level 1 (its own inference server, each role
on half the cores) and, as the quick start does, `deployment: colocated` with 0 (the trainer
hosts the engine; they take turns on every core). A colocated run writes weights to disk only
at checkpoints, so it checkpoints every `--colocated-save-steps` steps here for the snapshots: a
cost and a lag the disaggregated run, which writes a broadcast every step anyway, does not pay.

Reports (a) seconds to reach `start + --target-gain` held-out reward and asyncrl's speed-up,
and (b) the reward gained at 1, 3 and 5 minutes. Prints one JSON line.

    .venv-bench/bin/python benchmarks/rl_vs_trl.py --sft outputs/demo/sft/final
    (`make bench-setup` makes .venv-bench: asyncrl plus the `bench` extra, TRL)
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from asyncrl.envs.reverse_text import ReverseTextEnv, lcs_ratio
from asyncrl.evaluate import evaluate
from asyncrl.precision import resolve_recipe
from asyncrl.transport.broadcast import latest_broadcast

REPO = Path(__file__).resolve().parents[1]
MARKS = (60, 180, 300)


def held_out(model_dir: Path, tokenizer_dir: Path, prompts: int) -> float:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    result = evaluate(model, tokenizer, ReverseTextEnv(), num_examples=prompts, temperature=1.0)
    return result.mean_reward


def snapshot_times(budget: float, every: float) -> list[float]:
    times = sorted(
        {*(t for t in MARKS if t <= budget), *range(int(every), int(budget) + 1, int(every))}
    )
    return [float(t) for t in times]


def run_asyncrl(args: argparse.Namespace, work: Path, colocated: bool) -> dict[float, Path]:
    output = work / ("asyncrl-colocated" if colocated else "asyncrl")
    command = [
        sys.executable, "-m", "asyncrl.cli", "rl", str(REPO / "examples/reverse_text/rl.yaml"),
        "--model", args.sft, "--output_dir", str(output), "--max_steps", "100000",
        "--trainer.learning_rate", str(args.lr), "--trainer.recipe", args.recipe,
        "--orchestrator.batch_size", str(args.batch),
        "--orchestrator.rollouts_per_example", str(args.group),
        "--orchestrator.sampling.max_tokens", str(args.max_tokens),
    ]  # fmt: skip
    if colocated:
        command += ["--deployment", "colocated", "--max_async_level", str(args.colocated_k),
                    "--trainer.save_steps", str(args.colocated_save_steps)]  # fmt: skip
    else:
        command += ["--deployment", "disaggregated", "--max_async_level", "1"]
    snapshots: dict[float, Path] = {}
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for mark in snapshot_times(args.budget, args.every):
            time.sleep(max(0.0, started + mark - time.monotonic()))
            for _ in range(3):  # the trainer may prune the directory while it is copied
                newest = latest_broadcast(output / "run_default")
                if newest is None or newest.kind != "full":
                    break
                target = work / "snapshots" / f"{output.name}-{int(mark)}"
                try:
                    shutil.copytree(newest.path, target)
                except (FileNotFoundError, shutil.Error):
                    shutil.rmtree(target, ignore_errors=True)
                    continue
                snapshots[mark] = target
                break
    finally:
        process.send_signal(signal.SIGTERM)  # SIGINT may be ignored when run in background
        process.wait(timeout=120)
    return snapshots


class Snapshots(TrainerCallback):  # type: ignore[misc]
    """Saves the policy at each mark of wall clock and stops TRL at the budget."""

    def __init__(self, started: float, marks: list[float], directory: Path) -> None:
        self.started, self.marks, self.directory = started, list(marks), directory
        self.saved: dict[float, Path] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> Any:
        elapsed = time.monotonic() - self.started
        while self.marks and elapsed >= self.marks[0]:
            mark = self.marks.pop(0)
            target = self.directory / f"trl-{int(mark)}"
            model.save_pretrained(target)
            self.saved[mark] = target
        if not self.marks:
            control.should_training_stop = True
        return control


def run_trl(args: argparse.Namespace, work: Path) -> dict[float, Path]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    started = time.monotonic()
    examples = ReverseTextEnv().examples("train", 20_000)
    dataset = Dataset.from_list([{"prompt": e.prompt, "answer": e.answer} for e in examples])

    def lcs_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        return [lcs_ratio(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]

    config = GRPOConfig(
        output_dir=str(work / "trl"), use_cpu=True, bf16=args.recipe == "bf16",
        gradient_checkpointing=False,
        learning_rate=args.lr, lr_scheduler_type="constant", weight_decay=0.0,
        max_grad_norm=1.0, per_device_train_batch_size=args.batch,
        num_generations=args.group, max_completion_length=args.max_tokens,
        temperature=1.0, top_k=0, top_p=1.0, beta=0.0, loss_type="grpo", epsilon=0.2,
        scale_rewards="none", num_iterations=1, max_steps=100_000, logging_steps=10,
        save_strategy="no", report_to="none", seed=0,
    )  # fmt: skip
    callback = Snapshots(started, snapshot_times(args.budget, args.every), work / "snapshots")
    trainer = GRPOTrainer(
        model=args.sft, reward_funcs=lcs_reward, args=config, train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(args.sft), callbacks=[callback],
    )  # fmt: skip
    trainer.train()
    return callback.saved


def first_time_at(curve: dict[float, float], target: float) -> float | None:
    return next((t for t, reward in sorted(curve.items()) if reward >= target), None)


def speedup_over(ours: float | None, theirs: float | None, budget: float) -> float | str | None:
    """TRL's seconds to the target over ours; when TRL never got there, a lower bound."""
    if ours and theirs:
        return round(theirs / ours, 2)
    if ours:
        return f">= {budget / ours:.1f}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sft", required=True, help="SFT checkpoint both start from")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per system")
    parser.add_argument("--every", type=float, default=20.0, help="seconds between snapshots")
    parser.add_argument("--target-gain", type=float, default=0.02)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=32, help="completions per step")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=256, help="held-out prompts")
    parser.add_argument(
        "--systems", nargs="+", default=["asyncrl", "asyncrl-colocated", "trl"],
        choices=["asyncrl", "asyncrl-colocated", "trl"],
    )  # fmt: skip
    parser.add_argument("--colocated-k", type=int, default=0, help="its max_async_level")
    parser.add_argument("--colocated-save-steps", type=int, default=4)
    args = parser.parse_args()
    args.recipe = resolve_recipe("auto").recipe  # both systems run what this device runs fast
    sft = Path(args.sft)
    start = held_out(sft, sft, args.prompts)
    target = start + args.target_gain
    curves: dict[str, dict[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for system in args.systems:
            if system == "trl":
                snapshots = run_trl(args, work)
            else:
                snapshots = run_asyncrl(args, work, colocated=system == "asyncrl-colocated")
            curves[system] = {0.0: start} | {
                t: held_out(path, sft, args.prompts) for t, path in snapshots.items()
            }
            print(f"{system}: {curves[system]}", file=sys.stderr)
    to_target = {name: first_time_at(curve, target) for name, curve in curves.items()}
    gained = {
        name: {f"{int(t // 60)}min": round(curve[t] - start, 4) for t in MARKS if t in curve}
        for name, curve in curves.items()
    }
    speedup = {
        name: speedup_over(to_target.get(name), to_target.get("trl"), args.budget)
        for name in curves
        if name != "trl"
    }
    print(json.dumps({
        "benchmark": "rl_vs_trl", "start_reward": round(start, 4), "target": round(target, 4),
        "seconds_to_target": to_target,
        "speedup_to_target": speedup,
        "gain_at": gained,
        "curves": {n: {str(int(t)): round(r, 4) for t, r in c.items()} for n, c in curves.items()},
        "settings": {k: v for k, v in vars(args).items() if k != "systems"},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
