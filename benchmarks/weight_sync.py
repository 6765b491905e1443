"""Bytes and seconds per weight sync, a delta against the full version, on the files transport.

Full fine-tuning of an `asyncrl init-model` preset (`base`: about 50 M parameters) with AdamW on
random gradients (each weight moves by about the learning rate a step, as in RL), every version
written as the trainer writes it (`FilesRoute`: weights, manifest, and the delta from the
version before) and loaded by an embedded server as the orchestrator asks it to, on the same
versions twice: by a server fed with deltas (`delta: on`) and by one fed full versions
(`delta: off`). Done for bfloat16 serving of the float32 master weights and for float32
serving. Per sync: the trainer's seconds to write the version (the full weights are always
written; the delta route also hashes at the served dtype and encodes the delta), the server's
seconds to load it, and the bytes it read; and what `delta: auto` would send. The first
version is loaded whole by both servers and not counted. Prints one JSON line.

    nice -n 19 python benchmarks/weight_sync.py [--preset base | --model DIR] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import cpu_name


def one_dtype(model_dir: Path, served: str, steps: int, lr: float, root: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from asyncrl.config.inference import InferenceConfig
    from asyncrl.config.trainer import TrainerConfig
    from asyncrl.inference.server import load_served_model
    from asyncrl.transport.weights.delta import DeltaPolicy
    from asyncrl.transport.weights.files import FilesRoute

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    routes, servers = {}, {}
    for mode in ("on", "off"):
        config = TrainerConfig(
            model=str(model_dir), max_async_level=2,
            weight_broadcast={"served_dtype": served, "delta": mode},
        )  # fmt: skip
        routes[mode] = FilesRoute(config, root / f"{served}-{mode}")
        inference = InferenceConfig(
            model=str(model_dir), dtype=served, max_num_seqs=1, max_model_len=64,
            kv_cache_memory_bytes=2**24, weight_roots=[str(root)],
        )  # fmt: skip
        servers[mode] = load_served_model(inference)
    timings: dict[str, dict[str, list[float]]] = {
        mode: {"write_s": [], "load_s": [], "bytes_read": []} for mode in routes
    }
    auto_sends = []
    try:
        for version in range(1, steps + 2):
            if version > 1:  # one optimizer step on random gradients
                for parameter in model.parameters():
                    parameter.grad = torch.randn(parameter.shape, generator=generator)
                optimizer.step()
            for mode, route in routes.items():
                started = time.perf_counter()
                route.publish(version, model, None)
                route.wait()
                written = time.perf_counter() - started
                directory = route.run_dir / "broadcasts" / f"step_{version}"
                started = time.perf_counter()
                info = servers[mode].update_weights(str(directory), version)
                loaded = time.perf_counter() - started
                if version == 1:
                    continue
                assert info.verified == info.fingerprint and info.loaded == (
                    "delta" if mode == "on" else "full"
                ), info
                timings[mode]["write_s"].append(written)
                timings[mode]["load_s"].append(loaded)
                timings[mode]["bytes_read"].append(float(info.bytes_read))
            sizes = routes["on"].sizes
            if version > 1 and "trainer/weights_delta_bytes" in sizes:
                policy = DeltaPolicy("auto", torch.float32, routes["on"].served_dtype)
                full, delta = (
                    sizes["trainer/weights_full_bytes"],
                    sizes["trainer/weights_delta_bytes"],
                )
                auto_sends.append(policy.wanted and policy.pays(delta, full))
    finally:
        for server in servers.values():
            server.engine.shutdown()
    means = {
        mode: {key: statistics.mean(values) for key, values in figures.items()}
        for mode, figures in timings.items()
    }
    delta, full = means["on"], means["off"]
    return {
        "served_dtype": served,
        "delta": delta,
        "full": full,
        "delta_bytes_fraction": delta["bytes_read"] / full["bytes_read"],
        "load_speedup": full["load_s"] / delta["load_s"],
        # written and loaded: the delta route writes the full weights too, so this is its worst
        "sync_speedup": (full["write_s"] + full["load_s"]) / (delta["write_s"] + delta["load_s"]),
        "auto_sends_delta": all(auto_sends) if auto_sends else None,
    }


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", choices=["tiny", "small", "base"])
    parser.add_argument("--model", type=Path, help="a model directory instead of a preset")
    parser.add_argument("--steps", type=int, default=4, help="timed syncs per served dtype")
    parser.add_argument("--lr", type=float, default=1e-5, help="AdamW's learning rate")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    return parser


def main() -> None:
    arguments = parser().parse_args()

    import torch
    from safetensors.torch import load_file

    from asyncrl.config.init_model import InitModelConfig
    from asyncrl.models.init_model import init_model

    with tempfile.TemporaryDirectory(prefix="asyncrl-weight-sync-") as scratch:
        root = Path(scratch)
        model_dir = arguments.model or init_model(
            InitModelConfig(preset=arguments.preset, output_dir=str(root / "model"))
        )
        params = sum(
            sum(t.numel() for t in load_file(path).values())
            for path in Path(model_dir).glob("*.safetensors")
        )
        results = [
            one_dtype(model_dir, served, arguments.steps, arguments.lr, root / "runs")
            for served in arguments.dtypes
        ]
    print(
        json.dumps(
            {
                "benchmark": "weight_sync",
                "model": str(arguments.model) if arguments.model else arguments.preset,
                "parameters": params,
                "steps": arguments.steps,
                "lr": arguments.lr,
                "cpu": cpu_name(),
                "torch_threads": torch.get_num_threads(),
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
