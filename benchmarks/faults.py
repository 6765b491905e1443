"""Fault injection: kill a random role of `asyncrl rl` at a random moment, and audit the run.

Each trial runs `asyncrl rl` on the `tiny` preset (reverse-text, 8 steps, checkpoints every 2)
with automatic restarts, and once the trainer has made a random number of steps it hits one
role: SIGKILL, or SIGSTOP (a "hang", which the launcher must notice by the silent heartbeat).
The trials go through every kind of fault in turn (each role killed and frozen; the trainer
also hit in the middle of writing a broadcast or a checkpoint: those trials wait for the
staging directory to appear). Every fourth trial runs colocated (the trainer serves; there is
no inference process). With `--weights nccl` the weights go over the NCCL/gloo group instead of
files, whose rebuilding is then under test too (no colocated trials: that layout syncs in
memory). After each run the run directory is audited
(`asyncrl.monitor.run_audit`): every step trained and batched exactly once, nothing
half-written, every batch within its staleness bounds, the final weights loadable; and no
process of the run may be left. Prints one JSON line:

    python benchmarks/faults.py --trials 20 [--seed 0] [--weights filesystem|nccl]

trials, survived, steps lost / repeated, corrupt files, orphans, and the median recovery time
per role and fault: seconds from the fault until the role does its job again (`recovery`),
its restart, resume, and redoing of withdrawn steps included.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from asyncrl.config.init_model import InitModelConfig
from asyncrl.launch.inference_process import free_port
from asyncrl.models.init_model import init_model
from asyncrl.monitor.metrics import read_metrics
from asyncrl.monitor.run_audit import audit_run
from machine import cpu_name  # benchmarks/machine.py, beside this file

STEPS = 8
ASYNC_LEVEL = 1
OFF_POLICY = 2
HANG_TIMEOUT = 5.0
RUN_TIMEOUT = 600.0


@dataclass
class Trial:
    deployment: str
    role: str
    fault: str  # SIGKILL | SIGSTOP
    moment: str  # random | mid-broadcast | mid-checkpoint
    after_step: int
    hit_at_step: int = 0
    caught_writing: bool | None = None  # aimed at a write: was it under way when hit?
    survived: bool = False
    exit_code: int | None = None
    recovery_s: float | None = None
    steps_lost: int = 0
    steps_repeated: int = 0
    corrupt_files: int = 0
    orphans: int = 0
    problems: list[str] = field(default_factory=list)


def write_config(model: Path, output: Path, colocated: bool, weights: str) -> Path:
    broadcast = {"type": weights, "port": free_port(), "timeout": 120} if weights == "nccl" else {}
    config = {
        "model": str(model), "output_dir": str(output), "seq_len": 256, "max_steps": STEPS,
        "max_async_level": 0 if colocated else ASYNC_LEVEL,
        "deployment": "colocated" if colocated else "disaggregated",
        "restart": {"backoff": 0.5, "hang_timeout": HANG_TIMEOUT},
        "inference": {"port": free_port(), "max_num_seqs": 32},
        "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 8,
                         "rollouts_per_example": 4, "sampling": {"max_tokens": 12},
                         "max_off_policy_steps": OFF_POLICY, "ckpt": {"interval": 2}},
        "trainer": {"lora": False, "optimizer": "adamw", "recipe": "fp32",
                    "learning_rate": 1e-4, "weight_broadcast": broadcast},
    }  # fmt: skip
    path = output.parent / f"{output.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_processes(marker: str) -> list[tuple[int, str]]:
    result = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True)
    found = []
    for line in result.stdout.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        if marker in args and "ps -eww" not in args and int(pid) != os.getpid():
            found.append((int(pid), args))
    return found


def role_pid(output: Path, role: str) -> int | None:
    for pid, args in run_processes(str(output)):
        if f"asyncrl.cli {role} " in args:
            return pid
    return None


def role_steps(run_dir: Path, role: str) -> list[tuple[int, float]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [(r["step"], r["time"]) for r in read_metrics(path, role=role)]


def server_version(config: Path) -> int | None:
    port = yaml.safe_load(config.read_text())["inference"]["port"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/weight_info", timeout=1) as answer:
            return int(json.load(answer)["version"])
    except OSError:
        return None


def recovery(
    trial: Trial, run_dir: Path, hit: float, batches_before: int, server_back: float | None
) -> float | None:
    """Seconds from the fault until the role did its job again: the trainer trained a step
    beyond the last it had recorded, the orchestrator wrote a batch beyond its last, the server
    answered with the weights it had before."""
    if trial.role == "infer":
        return None if server_back is None else round(server_back - hit, 2)
    role, last = ("trainer", trial.hit_at_step) if trial.role == "train" else (
        "orchestrator", batches_before)  # fmt: skip
    later = [t for s, t in role_steps(run_dir, role) if s > last]
    return round(min(later) - hit, 2) if later else None


def staging_appeared(run_dir: Path, moment: str) -> bool:
    if moment == "mid-broadcast":
        return any((run_dir / "broadcasts").glob(".step_*.tmp"))
    return any((run_dir / "checkpoints").glob("step_*/.trainer.tmp"))


def run_trial(trial: Trial, model: Path, output: Path, weights: str) -> Trial:
    run_dir = output / "run_default"
    config = write_config(model, output, trial.deployment == "colocated", weights)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + RUN_TIMEOUT
    hit_time, batches_before, version_before = None, 0, None
    while launcher.poll() is None and time.monotonic() < deadline:
        steps = role_steps(run_dir, "trainer")
        reached = max((s for s, _ in steps), default=0)
        ready = reached >= trial.after_step
        if ready and trial.moment != "random" and not staging_appeared(run_dir, trial.moment):
            ready = reached >= STEPS - 1  # never caught writing: hit it now rather than never
        pid = role_pid(output, trial.role) if ready else None
        if pid is not None:
            trial.hit_at_step = reached
            if trial.moment != "random":
                trial.caught_writing = staging_appeared(run_dir, trial.moment)
            batches_before = max((s for s, _ in role_steps(run_dir, "orchestrator")), default=0)
            version_before = server_version(config)
            os.kill(pid, getattr(signal, trial.fault))
            hit_time = time.time()
            break
        time.sleep(0.002 if trial.moment != "random" and reached >= trial.after_step else 0.05)
    server_back = None
    if hit_time is not None and trial.role == "infer":  # back, and on the weights it had
        while launcher.poll() is None and time.monotonic() < deadline:
            version = server_version(config)
            if version is not None and version_before is not None and version >= version_before:
                server_back = time.time()
                break
            time.sleep(0.05)
    try:
        _, errors = launcher.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        launcher.kill()
        _, errors = launcher.communicate()
        trial.problems.append("the run did not finish in time")
    trial.exit_code = launcher.returncode
    time.sleep(1.0)  # children the launcher stopped have a moment to go
    trial.orphans = len(run_processes(str(output)))
    for pid, _ in run_processes(str(output)):
        os.kill(pid, signal.SIGKILL)
    if hit_time is None:
        trial.problems.append("the fault was never injected")
    if launcher.returncode != 0:
        trial.problems.append(f"exit {launcher.returncode}: {errors[-1500:]}")
    if run_dir.joinpath("metrics.jsonl").exists():
        audit = audit_run(run_dir, STEPS, 0 if trial.deployment == "colocated" else ASYNC_LEVEL,
                          0 if trial.deployment == "colocated" else OFF_POLICY)  # fmt: skip
        trial.steps_lost = sum(len(v) for v in audit.steps_lost.values())
        trial.steps_repeated = sum(len(v) for v in audit.steps_repeated.values())
        trial.corrupt_files = len(audit.half_written) + (audit.final_weights is not None)
        trial.problems += audit.problems
        if hit_time is not None:
            trial.recovery_s = recovery(trial, run_dir, hit_time, batches_before, server_back)
    trial.survived = not trial.problems and trial.orphans == 0
    return trial


# every kind of fault in turn (role, signal, moment); every fourth trial runs colocated
DISAGGREGATED = [
    ("infer", "SIGKILL", "random"), ("orch", "SIGKILL", "random"),
    ("train", "SIGKILL", "random"), ("train", "SIGKILL", "mid-broadcast"),
    ("train", "SIGKILL", "mid-checkpoint"), ("infer", "SIGSTOP", "random"),
    ("orch", "SIGSTOP", "random"), ("train", "SIGSTOP", "random"),
]  # fmt: skip
COLOCATED = [("train", "SIGKILL", "random"), ("orch", "SIGKILL", "random"),
             ("train", "SIGSTOP", "random"), ("orch", "SIGSTOP", "random")]  # fmt: skip


def plan(trials: int, rng: random.Random, with_colocated: bool) -> list[Trial]:
    """Every kind of fault in turn, each at a random step."""
    kinds = iter(DISAGGREGATED * trials), iter(COLOCATED * trials)
    planned = []
    for index in range(trials):
        colocated = with_colocated and index % 4 == 3
        role, fault, moment = next(kinds[colocated])
        planned.append(Trial("colocated" if colocated else "disaggregated", role, fault, moment,
                             after_step=rng.randint(1, STEPS - 2)))  # fmt: skip
    return planned


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weights", choices=["filesystem", "nccl"], default="filesystem")
    return parser


def main() -> None:
    args = parser().parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="asyncrl-faults-") as temp:
        workdir = Path(temp)
        model = init_model(InitModelConfig(preset="tiny", output_dir=str(workdir / "model")))
        results = []
        trials = plan(args.trials, rng, with_colocated=args.weights == "filesystem")
        for number, trial in enumerate(trials, start=1):
            started = time.monotonic()
            result = run_trial(trial, model, workdir / f"trial-{number}", args.weights)
            results.append(result)
            print(f"trial {number}: {json.dumps(asdict(result))} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    times: dict[str, list[float]] = {}
    for result in results:
        if result.recovery_s is not None:
            times.setdefault(f"{result.role}/{result.fault}", []).append(result.recovery_s)
    print(json.dumps({
        "benchmark": "faults", "cpu": cpu_name(), "cores": os.cpu_count(),
        "weights": args.weights,
        "trials": len(results), "survived": sum(r.survived for r in results),
        "steps_lost": sum(r.steps_lost for r in results),
        "steps_repeated": sum(r.steps_repeated for r in results),
        "corrupt_files": sum(r.corrupt_files for r in results),
        "orphans": sum(r.orphans for r in results),
        "median_recovery_s": {k: round(statistics.median(v), 2) for k, v in sorted(times.items())},
        "faults": {k: len(v) for k, v in sorted(times.items())},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
