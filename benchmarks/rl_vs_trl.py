"""asyncrl against TRL's GRPOTrainer, raced on this machine: the same SFT start, task, reward,
completions per step, learning rate, loss and precision, each system in its own process with
its clock from launch, seeds interleaved (A B C A B C …).

Contestants: `asyncrl` (the workload's example config as written: `deployment: auto`, here
generation overlapping training), `asyncrl-onpolicy` (the same, colocated with
`max_async_level: 0`: strictly on-policy, as TRL is; its reward per completion must follow
TRL's, the proof that the race is fair) and `trl` (`race_trl.py`). Nothing runs that only one
system does: no online evaluation; snapshots of weights only, every `--every` steps (asyncrl
keeps them as broadcasts, `trainer.weights_interval`; TRL saves them, timed apart). Torch
threads: asyncrl's launcher gives each role its share of the cores (recorded), TRL gets every
core. After each run its snapshots are scored on `--prompts` held-out prompts, sampled at
T = 1 with a fixed seed per prompt and greedy, by one float32 server (`race_eval.py`).

Reports, as one JSON line (and `race.json`, a plot `race.png` in `--out`): per system the reward
against seconds and against completions trained (mean over seeds with a 95 % bootstrap band),
seconds to `--target-gain` above the SFT model's sampled reward (mean, 95 % interval; a seed that
never got there is counted as not reaching it), TRL's time over each asyncrl system's (the
speed-up, with its interval), how far the on-policy curves overlap, and each system's mean step
decomposition (`race_decomposition.py`).

Workloads: the toy quick start (`quickstart`, `long`), the real-model quick start (`smollm2`) and
the same settings on tasks nobody tuned on (`smollm2-chain-sum-wide`, `smollm2-products`: the
quick start's config with `benchmarks/workloads/*.yaml` laid over it, chosen before racing).
`--variant NAME:KEY=VALUE,…` races another asyncrl configuration as `asyncrl-NAME`. Learning
per sample is read both against completions trained (steps × batch) and against completions
generated (a variant that drops groups made more than it trained on).
`--report-only` summarises a stored race again without running anything.

    make bench-setup   # .venv-bench: asyncrl + TRL
    .venv-bench/bin/python benchmarks/rl_vs_trl.py --workload quickstart \
        --sft outputs/demo/sft/final
    .venv-bench/bin/python benchmarks/rl_vs_trl.py --workload long --sft outputs/long/sft/final
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config.loading import load_config
from asyncrl.config.rl import RLConfig
from asyncrl.config.trainer import LossConfig
from asyncrl.envs.registry import load_environment
from asyncrl.fs import atomic_write_bytes
from asyncrl.launch.inference_process import free_port
from asyncrl.launch.local import thread_budget
from asyncrl.precision import resolve_recipe
from machine import cpu_name
from race_decomposition import asyncrl_decomposition, generated_by_step, trl_decomposition
from race_eval import snapshot_scorer
from race_report import summarise

REPO = Path(__file__).resolve().parents[1]
# a workload: config files merged in order (a later one's keys win): the real-model quick start
# and the same settings on tasks nobody tuned on (benchmarks/workloads/), chosen before racing
SMOLLM2 = "examples/smollm2_chain_sum/rl.yaml"
WORKLOADS = {
    "quickstart": ["examples/reverse_text/rl.yaml"],
    "long": ["examples/reverse_text_long/rl.yaml"],
    "smollm2": [SMOLLM2],
    "smollm2-chain-sum-wide": [SMOLLM2, "benchmarks/workloads/chain_sum_wide.yaml"],
    "smollm2-products": [SMOLLM2, "benchmarks/workloads/products.yaml"],
    # issue 82's two untuned tasks (chosen before any run: benchmarks/RESULTS.md, 2026-12-07)
    "smollm2-word-reversal": [SMOLLM2, "benchmarks/workloads/word_sequence_reversal.yaml"],
    "smollm2-leg-counting": [SMOLLM2, "benchmarks/workloads/leg_counting.yaml"],
}
SYSTEMS = ("asyncrl", "asyncrl-onpolicy", "trl")
ONPOLICY = ["--deployment", "colocated", "--max_async_level", "0"]
# asyncrl's clipped losses and TRL's names for the same objective and normalisation (sequence
# mean; 1 / (sequences · max_tokens); token mean): the race's losses must match
TRL_LOSSES = {"grpo_clip": "grpo", "dr_grpo": "dr_grpo", "dapo": "dapo"}


@dataclass
class Run:
    system: str
    seed: int
    snapshots: list[dict[str, Any]]  # step, seconds since launch, path
    steps_in_budget: int
    decomposition: dict[str, float]
    threads: dict[str, str]


def stop_at_budget(process: subprocess.Popen[bytes], launched: float, budget: float) -> None:
    """Stop the run at the budget; a run that ends before it (its `max_steps`) is not waited
    for."""
    try:
        process.wait(timeout=max(0.0, launched + budget - time.monotonic()))
        return
    except subprocess.TimeoutExpired:
        pass
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=180)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def variant(text: str) -> tuple[str, list[str]]:
    """`--variant NAME:KEY=VALUE,KEY=VALUE` -> ("asyncrl-NAME", its command-line overrides); a
    value cannot hold a comma."""
    name, _, settings = text.partition(":")
    if not name or not settings:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: write NAME:KEY=VALUE[,KEY=VALUE]")
    if f"asyncrl-{name}" in SYSTEMS:
        raise argparse.ArgumentTypeError(f"--variant {name}: a built-in contestant's name")
    overrides = []
    for item in settings.split(","):
        key, _, value = item.partition("=")
        overrides += [f"--{key}", value]
    return f"asyncrl-{name}", overrides


def run_asyncrl(
    system: str,
    seed: int,
    configs: list[Path],
    overrides: list[str],
    out: Path,
    budget: float,
    every: int,
    max_steps: int,
) -> Run:
    command = [sys.executable, "-m", "asyncrl.cli", "rl", *map(str, configs), *overrides,
               "--output_dir", str(out), "--max_steps", str(max_steps),
               "--orchestrator.eval", "null",
               "--trainer.weights_interval", str(every), "--trainer.seed", str(seed),
               "--orchestrator.seed", str(seed), "--inference.port", str(free_port())]  # fmt: skip
    launched_wall, launched = time.time(), time.monotonic()
    with open(out.parent / f"{out.name}.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        stop_at_budget(process, launched, budget)
    run_dir = out / "run_default"
    resolved: RLConfig = load_config(RLConfig, list(map(str, configs)), overrides)
    generated = generated_by_step(run_dir / "metrics.jsonl", resolved.orchestrator.batch_size,
                                  resolved.orchestrator.rollouts_per_example)  # fmt: skip
    snapshots = []
    for marker in sorted((run_dir / "broadcasts").glob("step_*/STABLE")):
        step = int(marker.parent.name.removeprefix("step_"))
        seconds = json.loads(marker.read_text())["time"] - launched_wall
        if step % every == 0 and seconds <= budget:
            snapshots.append({"step": step, "seconds": seconds, "path": str(marker.parent),
                              "generated": generated.get(step)})  # fmt: skip
    decomposition, steps = asyncrl_decomposition(run_dir / "metrics.jsonl", budget, launched_wall)
    threads = {role: env.get("OMP_NUM_THREADS", "all") for role, env in
               thread_budget(resolved.deployment == "colocated").items() if env}  # fmt: skip
    return Run(system, seed, sorted(snapshots, key=lambda s: s["step"]), steps,
               decomposition, threads)  # fmt: skip


def trl_loss_arguments(loss: LossConfig) -> list[str]:
    """`race_trl.py`'s arguments for the workload's loss; a loss TRL has no match for stops the
    race before it starts (a race of different objectives would not be one)."""
    unmatched = loss.type not in TRL_LOSSES or loss.beta > 0
    if loss.type == "dr_grpo" and loss.dr_grpo_length != "max_tokens":
        unmatched = True  # TRL's dr_grpo divides by max_completion_length
    if unmatched:
        raise SystemExit(
            f"trainer.loss {loss.type}: TRL races only {sorted(TRL_LOSSES)}, with beta 0 "
            "(dr_grpo over max_tokens)"
        )
    arguments = ["--loss-type", TRL_LOSSES[loss.type], "--epsilon", str(loss.epsilon)]
    if loss.epsilon_high is not None:
        arguments += ["--epsilon-high", str(loss.epsilon_high)]
    return arguments


def run_trl(
    seed: int, settings: RLConfig, sft: Path, out: Path, budget: float, every: int, examples: int
) -> Run:
    orchestrator, trainer = settings.orchestrator, settings.trainer
    command = [sys.executable, str(REPO / "benchmarks" / "race_trl.py"), "--sft", str(sft),
               "--out", str(out), "--env", orchestrator.env[0].id,
               "--env-args", json.dumps(orchestrator.env[0].args), "--budget", str(budget),
               "--every", str(every), "--seed", str(seed), "--lr", str(trainer.learning_rate),
               "--batch", str(orchestrator.batch_size),
               "--group", str(orchestrator.rollouts_per_example),
               "--max-tokens", str(orchestrator.sampling.max_tokens),
               "--temperature", str(orchestrator.sampling.temperature),
               "--examples", str(examples),
               "--threads", str(len(os.sched_getaffinity(0))),
               *trl_loss_arguments(trainer.loss)]  # fmt: skip
    if orchestrator.mask_truncated_completions:
        command.append("--mask-truncated")
    if resolve_recipe(trainer.recipe).recipe == "bf16":
        command.append("--bf16")
    if trainer.lora:
        command += ["--lora-rank", str(trainer.lora_rank), "--lora-alpha", str(trainer.lora_alpha),
                    "--lora-targets", *trainer.lora_target_modules]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RACE_LAUNCHED_AT": repr(time.time()), "PYTHONPATH": str(REPO)}
    with open(out.parent / f"{out.name}.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        process.wait(timeout=budget + 600)  # it stops itself at the budget
    if process.returncode != 0:
        raise RuntimeError(f"TRL exited with {process.returncode}; see {out}.log")
    snapshots = json.loads((out / "snapshots.json").read_text())
    recorded = json.loads((out / "decomposition.json").read_text())
    decomposition = trl_decomposition(recorded["steps"])
    steps = len(recorded["steps"])
    return Run("trl", seed, snapshots, steps, decomposition, {"trl": str(recorded["threads"])})


def _same_setting(then: Any, now: Any) -> bool:
    """Equal, or, for a per-contestant table (snapshot intervals, variants), equal wherever both
    races had the contestant: a race may add a variant to an earlier one, never change one."""
    if isinstance(then, dict) and isinstance(now, dict):
        return all(then[name] == now[name] for name in then.keys() & now.keys())
    return bool(then == now)


def earlier_runs(
    merge: Path | None, settings_key: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, float] | None]:
    """The runs of an earlier race to report with this one's, after checking it raced the same
    way (budget, snapshot intervals, prompts scored, config): a run is only comparable to another
    under the same settings; the contestant tables of `settings_key` gain the earlier ones.
    Returns the runs and the SFT score it measured."""
    if merge is None:
        return [], None
    try:
        earlier = json.loads(merge.read_text())
        report, runs = earlier["report"], earlier["runs"]
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"--merge {merge}: not a race.json ({error})") from error
    differing = {key: (report["settings"].get(key), value) for key, value in settings_key.items()
                 if not _same_setting(report["settings"].get(key), value)}  # fmt: skip
    if differing:
        raise SystemExit(f"--merge {merge}: raced with other settings (then, now): {differing}")
    for table in ("every", "variants"):  # the report names every contestant, the earlier ones too
        settings_key[table] = {**report["settings"].get(table, {}), **settings_key[table]}
    return list(runs), report["start"]


def write_report(
    args: argparse.Namespace,
    settings: RLConfig,
    settings_key: dict[str, Any],
    start: dict[str, float],
    results: list[dict[str, Any]],
) -> dict[str, Any]:
    """Summarise the runs so far into `race.json` and `race.png` in `--out`; return the report."""
    batch = settings.orchestrator.batch_size
    report = summarise(results, start, args.target_gain, batch, args.budget, args.out / "race.png")
    report = {"benchmark": "rl_vs_trl", "workload": args.workload, "cpu": cpu_name(),
              "start": start, **report,
              "settings": {**settings_key, "completions_per_step": batch,
                           "seeds": {system: sorted(r["seed"] for r in results
                                                    if r["system"] == system)
                                     for system in sorted({r["system"] for r in results})},
                           "merged": str(args.merge) if args.merge else None}}  # fmt: skip
    # whole or not at all: a race stopped mid-write still leaves the previous race.json
    text = json.dumps({"report": report, "runs": results}, indent=1)
    atomic_write_bytes(args.out / "race.json", text.encode())
    return report


def report_again(args: argparse.Namespace, settings: RLConfig, stored: dict[str, Any]) -> None:
    """`--report-only`: the stored runs summarised by today's report code, under the stored
    settings; asyncrl points without a count of completions generated get it from their run."""
    report = stored["report"]
    if report["workload"] != args.workload or report["settings"]["set"] != args.set:
        raced = f"--workload {report['workload']} --set {report['settings']['set']}"
        raise SystemExit(f"--report-only: {args.out}/race.json raced {raced}; give the same")
    batch, group = settings.orchestrator.batch_size, settings.orchestrator.rollouts_per_example
    if report["settings"]["completions_per_step"] != batch:
        raise SystemExit(f"--report-only: the stored race trained {batch} completions a step")
    for run in stored["runs"]:
        metrics = args.out / f"{run['system']}-seed{run['seed']}" / "run_default" / "metrics.jsonl"
        if run["system"] == "trl":
            continue
        if not metrics.exists():
            raise SystemExit(f"--report-only: {metrics} is gone: its completions generated "
                             "cannot be counted")  # fmt: skip
        counts = generated_by_step(metrics, batch, group)
        for point in run["points"]:
            point.setdefault("generated", counts[point["step"]])
    settings_key = {k: v for k, v in report["settings"].items()
                    if k not in ("completions_per_step", "seeds", "merged")}  # fmt: skip
    print(json.dumps(write_report(args, settings, settings_key, report["start"], stored["runs"])))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="quickstart")
    parser.add_argument("--sft", type=Path, required=True, help="the SFT model all start from")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds: first, first+1, …")
    parser.add_argument(
        "--merge", type=Path, default=None, metavar="RACE_JSON",
        help="an earlier race.json of the same settings: its runs join this report (more seeds "
        "or another contestant without re-running the rest)",
    )  # fmt: skip
    parser.add_argument("--budget", type=float, default=720.0, help="seconds per run")
    parser.add_argument(
        "--every",
        type=int,
        nargs=3,
        default=[50, 25, 25],
        help="steps between snapshots: asyncrl, asyncrl-onpolicy, trl",
    )
    parser.add_argument("--target-gain", type=float, default=0.1)
    parser.add_argument(
        "--max-steps", type=int, default=1_000_000,
        help="asyncrl's max_steps (it stops at the budget): its prompt pool scales with it, and "
        "a small reasoning-gym task holds fewer prompts than a million steps ask for",
    )  # fmt: skip
    parser.add_argument(
        "--examples", type=int, default=20_000,
        help="training prompts TRL's dataset holds (a small reasoning-gym task holds fewer)",
    )  # fmt: skip
    parser.add_argument("--prompts", type=int, default=1024, help="held-out prompts scored")
    parser.add_argument(
        "--systems", nargs="*", choices=SYSTEMS, default=list(SYSTEMS),
        help="built-in contestants to run (none: only the --variant ones)",
    )  # fmt: skip
    parser.add_argument(
        "--variant", type=variant, action="append", default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="another asyncrl contestant, `asyncrl-NAME`: the workload with these overrides "
        "(snapshots every asyncrl's --every steps); repeatable",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("outputs/race"))
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE",
        help="overrides of the workload's config (`orchestrator.batch_size=64`), for every "
        "system: TRL takes its settings from the same config",
    )  # fmt: skip
    parser.add_argument(
        "--report-only", action="store_true",
        help="run nothing: summarise `--out`/race.json again (after a change to the report), "
        "counting each asyncrl snapshot's completions generated from its kept run directory",
    )  # fmt: skip
    args = parser.parse_args()
    configs = [REPO / path for path in WORKLOADS[args.workload]]
    overrides = ["--model", str(args.sft)]
    for item in args.set:
        key, _, value = item.partition("=")
        overrides += [f"--{key}", value]
    settings: RLConfig = load_config(RLConfig, list(map(str, configs)), overrides)
    env = load_environment(settings.orchestrator.env[0].id, settings.orchestrator.env[0].args)
    max_tokens = int(settings.orchestrator.sampling.max_tokens or 64)
    every = dict(zip(SYSTEMS, args.every, strict=True))
    contestants = {"asyncrl": [], "asyncrl-onpolicy": ONPOLICY, "trl": []}
    contestants.update(args.variant)
    systems = args.systems + [name for name, _ in args.variant]
    if not systems:
        raise SystemExit("nothing to race: name --systems or a --variant")
    every.update({name: every["asyncrl"] for name, _ in args.variant})
    if "trl" in systems:
        trl_loss_arguments(settings.trainer.loss)  # before any run: TRL must race the same loss
    args.out.mkdir(parents=True, exist_ok=True)
    settings_key = {"budget_s": args.budget, "every": every, "prompts": args.prompts,
                    "config": WORKLOADS[args.workload], "set": args.set,
                    "variants": {name: extra for name, extra in args.variant}}  # fmt: skip
    if args.report_only:
        stored = json.loads((args.out / "race.json").read_text())
        report_again(args, settings, stored)
        return
    results, earlier_start = earlier_runs(args.merge, settings_key)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for run in results:
        if run["system"] in systems and run["seed"] in seeds:
            raise SystemExit(f"{run['system']} seed {run['seed']} is already in {args.merge}")
    with snapshot_scorer(args.sft, args.out, env, args.prompts, max_tokens, args.out / "scorer.log",
                         settings.orchestrator.sampling.temperature) as scorer:  # fmt: skip
        start = scorer.score(None)
        print(f"SFT model: {start}", file=sys.stderr)
        if earlier_start is not None and any(
            abs(earlier_start[key] - start[key]) > 0.002 for key in start
        ):
            raise SystemExit(f"{args.merge} scored the SFT model {earlier_start}, now {start}: "
                             "not the same start, so not merged")  # fmt: skip
        for seed in seeds:
            for system in systems:
                out = args.out / f"{system}-seed{seed}"
                shutil.rmtree(out, ignore_errors=True)
                if system == "trl":
                    run = run_trl(seed, settings, args.sft, out, args.budget, every[system],
                                  args.examples)  # fmt: skip
                else:
                    run = run_asyncrl(system, seed, configs, overrides + contestants[system],
                                      out, args.budget,
                                      every[system], args.max_steps)  # fmt: skip
                points = [{**s, **scorer.score(Path(s["path"]))} for s in run.snapshots]
                results.append({
                    "system": system, "seed": seed, "steps": run.steps_in_budget,
                    "points": [{k: v for k, v in p.items() if k != "path"} for p in points],
                    "decomposition": run.decomposition, "threads": run.threads,
                })  # fmt: skip
                print(f"{system} seed {seed}: {run.steps_in_budget} steps, last "
                      f"{points[-1] if points else None}", file=sys.stderr)  # fmt: skip
                for snapshot in run.snapshots:  # scored: the weights are not needed any more
                    shutil.rmtree(snapshot["path"], ignore_errors=True)
                # after every run, so an interrupted race keeps every run it scored (its
                # race.json can be `--merge`d into the rest)
                write_report(args, settings, settings_key, start, results)
    print(json.dumps(write_report(args, settings, settings_key, start, results)))


if __name__ == "__main__":
    main()
