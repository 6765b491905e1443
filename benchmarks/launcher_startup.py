"""Start-up overhead of the Ray launcher against the local one, one run each, same config.

Builds a tiny model, then runs `asyncrl rl` twice on the same config (reverse-text, one inference
server, one trainer rank): with `launcher: local`, and with `launcher: ray` on a local Ray
instance the run starts itself. For each it measures the seconds from the command's start to the
orchestrator's first batch (its first record in metrics.jsonl) and to the run's end. Prints one
JSON line with both and the ray ÷ local ratios.

    python benchmarks/launcher_startup.py [--steps 4]

Needs Ray (`make ray`). The Ray figure includes starting the Ray instance itself (GCS, raylet,
workers); joining a running cluster (`ray.address: auto`) skips that part.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from machine import cpu_name  # benchmarks/machine.py, beside this file

REPO = Path(__file__).resolve().parents[1]


def first_orchestrator_record(metrics: Path) -> bool:
    if not metrics.exists():
        return False
    return any('"role": "orchestrator"' in line or '"role":"orchestrator"' in line
               for line in metrics.read_text().splitlines())  # fmt: skip


def timed_run(config: Path, output: Path) -> dict[str, float]:
    metrics = output / "run_default" / "metrics.jsonl"
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "rl", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first_batch = None
    while process.poll() is None:
        if first_batch is None and first_orchestrator_record(metrics):
            first_batch = time.monotonic() - started
        time.sleep(0.05)
    total = time.monotonic() - started
    if process.returncode != 0:
        raise SystemExit(f"run failed ({config}):\n{process.stderr.read()[-3000:]}")  # type: ignore[union-attr]
    return {"first_batch_s": round(first_batch or total, 2), "total_s": round(total, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="asyncrl-launcher-"))
    model = work / "tiny"
    subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "init-model", "--preset", "tiny",
         "--output_dir", str(model)],
        check=True, capture_output=True,
    )  # fmt: skip
    results = {}
    for launcher in ("local", "ray"):
        output = work / launcher
        config = {
            "model": str(model), "output_dir": str(output), "seq_len": 256,
            "max_steps": args.steps, "max_async_level": 1, "launcher": launcher,
            "inference": {"max_num_seqs": 32},
            "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 8,
                             "rollouts_per_example": 4, "sampling": {"max_tokens": 12}},
            "trainer": {"lora": False, "optimizer": "adamw", "recipe": "fp32",
                        "learning_rate": 1e-4},
        }  # fmt: skip
        path = work / f"{launcher}.yaml"
        path.write_text(yaml.safe_dump(config))
        results[launcher] = timed_run(path, output)
    print(json.dumps({
        "benchmark": "launcher_startup", "cpu": cpu_name(), "steps": args.steps,
        "local": results["local"], "ray": results["ray"],
        "first_batch_ratio_ray_over_local": round(
            results["ray"]["first_batch_s"] / results["local"]["first_batch_s"], 2),
        "extra_s_to_first_batch": round(
            results["ray"]["first_batch_s"] - results["local"]["first_batch_s"], 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
