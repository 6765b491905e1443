"""What forking the roles from the launcher saves: `role_start: fork` against `exec`.

Builds a tiny model, then runs the same short `asyncrl rl` (reverse-text, disaggregated: one
inference server, one trainer, one orchestrator) with `role_start: fork` and with `exec`,
alternating which goes first, `--seeds` times each. For every run it measures the seconds from
the command's start to the orchestrator's first batch and to the run's end, and the CPU seconds
(user + system) of the whole process tree: launcher, roles and their workers, every one reaped
(`RUSAGE_CHILDREN`). Then it kills the trainer once the run is under way and times how long the
restarted trainer takes to write its next step (`--restart`: once per layout and seed). Prints
one JSON line: each figure's mean and 95 % interval, and the fork ÷ exec ratios with theirs.

    python benchmarks/role_start.py [--seeds 5] [--steps 4]

`OMP_NUM_THREADS=1` before the command gives every process one thread, as `make test`'s
two-worker run does; without it the launcher splits the cores as a user's run has them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from machine import cpu_name  # benchmarks/machine.py, beside this file
from race_stats import bootstrap_mean, bootstrap_ratio

LAYOUTS = ("fork", "exec")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def trainer_steps(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    return sum('"role": "trainer"' in line for line in metrics.read_text().splitlines())


def first_batch_written(metrics: Path) -> bool:
    return metrics.exists() and '"role": "orchestrator"' in metrics.read_text()


def trainer_pid(output: Path) -> int | None:
    listing = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True)
    for line in listing.stdout.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        if str(output) in args and "asyncrl.cli train " in args:
            return int(pid)
    return None


def write_config(model: Path, output: Path, role_start: str, steps: int) -> Path:
    config = {
        "model": str(model), "output_dir": str(output), "seq_len": 256, "max_steps": steps,
        "max_async_level": 1, "deployment": "disaggregated", "role_start": role_start,
        "restart": {"backoff": 0.5}, "checkpoint": {"interval": 1},
        "inference": {"max_num_seqs": 32},
        "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 8,
                         "rollouts_per_example": 4, "sampling": {"max_tokens": 12}},
        "trainer": {"lora": False, "optimizer": "adamw", "recipe": "fp32",
                    "learning_rate": 1e-4},
    }  # fmt: skip
    path = output.parent / f"{output.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def timed_run(config: Path, output: Path, kill_trainer_after: int | None) -> dict[str, float]:
    """One run; with `kill_trainer_after`, the trainer is SIGKILLed after that many steps and
    the seconds until its next step are measured."""
    metrics = output / "run_default" / "metrics.jsonl"
    cpu_before, started = children_cpu_s(), time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first_batch = killed_at = back = None
    while process.poll() is None:
        now = time.monotonic()
        if first_batch is None and first_batch_written(metrics):
            first_batch = now - started
        steps = trainer_steps(metrics)
        if kill_trainer_after is not None and killed_at is None and steps >= kill_trainer_after:
            pid = trainer_pid(output)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed_at = now
        if killed_at is not None and back is None and steps > kill_trainer_after:  # type: ignore[operator]
            back = now - killed_at
        time.sleep(0.05)
    total = time.monotonic() - started
    _, errors = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"run failed ({config}):\n{errors[-3000:]}")
    figures = {"first_batch_s": first_batch or total, "total_s": total,
               "cpu_s": children_cpu_s() - cpu_before}  # fmt: skip
    if kill_trainer_after is not None:
        figures["trainer_back_s"] = back if back is not None else float("nan")
    return figures


def summary(runs: dict[str, list[dict[str, float]]], key: str) -> dict[str, object]:
    fork, exec_ = ([run[key] for run in runs[layout]] for layout in LAYOUTS)
    mean_f, low_f, high_f = bootstrap_mean(fork)
    mean_e, low_e, high_e = bootstrap_mean(exec_)
    ratio, low, high = bootstrap_ratio(fork, exec_)
    return {"fork": [round(mean_f, 2), round(low_f, 2), round(high_f, 2)],
            "exec": [round(mean_e, 2), round(low_e, 2), round(high_e, 2)],
            "fork_over_exec": [round(ratio, 3), round(low, 3), round(high, 3)]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--restart", action="store_true", help="also time a trainer restart")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="asyncrl-role-start-"))
    model = work / "tiny"
    subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "init-model", "--preset", "tiny",
         "--output_dir", str(model)],
        check=True, capture_output=True,
    )  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {layout: [] for layout in LAYOUTS}
    for seed in range(args.seeds):
        order = LAYOUTS if seed % 2 == 0 else LAYOUTS[::-1]
        for layout in order:
            output = work / f"{layout}-{seed}"
            config = write_config(model, output, layout, args.steps)
            kill_after = 2 if args.restart else None
            runs[layout].append(timed_run(config, output, kill_after))
    keys = ["first_batch_s", "total_s", "cpu_s"] + (["trainer_back_s"] if args.restart else [])
    print(json.dumps({
        "benchmark": "role_start", "cpu": cpu_name(), "seeds": args.seeds, "steps": args.steps,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        **{key: summary(runs, key) for key in keys},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
