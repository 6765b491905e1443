"""How busy the machine is during `asyncrl rl`: share of all CPU time spent working, and how
long the trainer and the inference server sat idle. Prints one JSON line.

    python benchmarks/utilisation.py [--preset tiny] [--steps 60]

CPU busy share comes from /proc/stat over the run's steady part (after the first batch).
Trainer idle share: its time waiting for batches ÷ the same span (from metrics.jsonl).
Inference idle share: the fraction of /metrics samples (every 0.1 s) with nothing running or
waiting.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from asyncrl.config.init_model import InitModelConfig
from asyncrl.launch.inference_process import free_port
from asyncrl.models.init_model import init_model
from asyncrl.monitor.metrics import read_metrics


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def gauge(text: str, name: str) -> float:
    match = re.search(rf"^asyncrl:{name}\S* (\S+)$", text, re.M)
    return float(match[1]) if match else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        model = init_model(InitModelConfig(preset=args.preset, output_dir=f"{workdir}/model"))
        port = free_port()
        config = yaml.safe_load(Path("examples/reverse_text/rl.yaml").read_text())
        config.update(model=str(model), output_dir=f"{workdir}/rl", max_steps=args.steps)
        config["inference"]["port"] = port
        path = Path(workdir) / "rl.yaml"
        path.write_text(yaml.safe_dump(config))
        run = subprocess.Popen([sys.executable, "-m", "asyncrl.cli", "rl", str(path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        metrics_file = Path(workdir) / "rl" / "run_default" / "metrics.jsonl"
        samples: list[bool] = []
        start_cpu = start_time = None
        while run.poll() is None:
            time.sleep(0.1)
            if start_cpu is None:
                if metrics_file.exists():  # steady state: the first batch is out
                    start_cpu, start_time = cpu_times(), time.monotonic()
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                    text = r.read().decode()
                samples.append(
                    gauge(text, "num_requests_running") + gauge(text, "num_requests_waiting") == 0
                )
            except OSError:
                break  # the server is shutting down: the run is over
        end_cpu, end_time = cpu_times(), time.monotonic()
        run.wait()
        assert run.returncode == 0, "the rl run failed"
        assert start_cpu is not None and start_time is not None
        records = read_metrics(metrics_file, role="trainer")
        waited = sum(r.get("trainer/wait_time", 0.0) for r in records[1:])
        span = end_time - start_time
        busy = (end_cpu[0] - start_cpu[0]) / max(1.0, end_cpu[1] - start_cpu[1])
    print(json.dumps({
        "benchmark": "utilisation", "preset": args.preset, "steps": args.steps,
        "seconds": round(span, 1), "cpu_busy_share": round(busy, 3),
        "trainer_idle_share": round(waited / span, 3),
        "inference_idle_share": round(sum(samples) / max(1, len(samples)), 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
