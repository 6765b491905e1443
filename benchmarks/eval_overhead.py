"""Training speed with online evaluation on against off: one `asyncrl rl` run each, same config.

Builds a tiny model and runs reverse-text twice, without and with `orchestrator.eval` (every
`--interval` steps, `--examples` held-out prompts, sampled), on the same servers. Training steps
per minute are taken from the trainer's records (first to last step, so start-up is left out).
Prints one JSON line with both rates and on ÷ off.

    python benchmarks/eval_overhead.py [--steps 30 --interval 5 --examples 32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from asyncrl.config.init_model import InitModelConfig
from asyncrl.models.init_model import init_model
from asyncrl.monitor.metrics import read_metrics
from asyncrl.precision import cpu_model_name


def steps_per_minute(metrics: Path) -> float:
    times = [r["time"] for r in read_metrics(metrics, role="trainer")]
    return 60.0 * (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--interval", type=int, default=5)
    parser.add_argument("--examples", type=int, default=32)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="asyncrl-eval-overhead-"))
    model = init_model(InitModelConfig(preset="tiny", output_dir=str(work / "tiny")))
    evaluation = {"interval": args.interval, "num_examples": args.examples,
                  "sampling": {"temperature": 1.0}}  # fmt: skip
    rates = {}
    for name, extra in (("off", {}), ("on", {"eval": evaluation})):
        output = work / name
        config = {
            "model": str(model), "output_dir": str(output), "seq_len": 256,
            "max_steps": args.steps, "max_async_level": 1,
            "inference": {"max_num_seqs": 64},
            "orchestrator": {"env": [{"id": "reverse-text"}], "batch_size": 16,
                             "rollouts_per_example": 4, "sampling": {"max_tokens": 16},
                             **extra},
            "trainer": {"lora": False, "optimizer": "adamw", "recipe": "fp32",
                        "learning_rate": 1e-4},
        }  # fmt: skip
        path = work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        run = subprocess.run(
            [sys.executable, "-m", "asyncrl.cli", "rl", str(path)], capture_output=True, text=True
        )
        if run.returncode != 0:
            raise SystemExit(f"run `{name}` failed:\n{run.stderr[-3000:]}")
        rates[name] = round(steps_per_minute(output / "run_default" / "metrics.jsonl"), 2)
    print(json.dumps({
        "benchmark": "eval_overhead", "cpu": cpu_model_name(), "steps": args.steps,
        "eval_interval": args.interval, "eval_examples": args.examples,
        "steps_per_min_off": rates["off"], "steps_per_min_on": rates["on"],
        "ratio_on_over_off": round(rates["on"] / rates["off"], 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
