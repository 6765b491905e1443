"""A weight transport of the user's, for tests only: what adding one costs is this module.

The trainer writes each version's tensors as one safetensors file into a spool directory
beside the run (`<output_dir>/weights_spool_<port>/`); every server's intake thread watches
the spool and installs the newest version it has not installed yet. Pushed like NCCL (the
orchestrator learns the version from the marker and the servers' `/weight_info`), carried
like files. Named in a config as `weight_broadcast.type: spool_weights:TRANSPORT`
with this folder on PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from asyncrl.config.inference import InferenceConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.transport.broadcast import publish_marker
from asyncrl.transport.fingerprint import weights_fingerprint
from asyncrl.transport.weights.route import State, WeightRoute, WeightTarget, WeightTransport

VERSION_FILE = re.compile(r"step_(\d+)\.safetensors")


def spool_dir(output_dir: str | Path, port: int) -> Path:
    return Path(output_dir) / f"weights_spool_{port}"


class SpoolRoute(WeightRoute):
    def __init__(self, config: TrainerConfig, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.spool = spool_dir(config.output_dir, config.weight_broadcast.port)
        self.keep, self.keep_every = config.max_async_level + 2, config.weights_interval

    def start(self, version: int, model: torch.nn.Module) -> None:
        self.spool.mkdir(parents=True, exist_ok=True)

    def publish(self, step: int, model: torch.nn.Module, state: State) -> dict[str, float]:
        parameters = {name: p.detach().contiguous() for name, p in model.named_parameters()}
        staging = self.spool / f".step_{step}.safetensors"
        save_file(parameters, staging)
        os.replace(staging, self.spool / f"step_{step}.safetensors")
        fingerprint = weights_fingerprint(model.named_parameters())
        publish_marker(
            self.run_dir, step, fingerprint, keep=self.keep, keep_every=self.keep_every,
            kind="pushed",
        )  # fmt: skip
        return {"spool/published_versions": float(step)}

    def republish(self, version: int, model: torch.nn.Module, state: State) -> bool:
        self.publish(version, model, state)
        return True


class SpoolIntake(threading.Thread):
    def __init__(self, target: WeightTarget, config: InferenceConfig) -> None:
        super().__init__(name="spool-intake", daemon=True)
        self.target = target
        self.spool = spool_dir(config.weight_roots[0], config.weight_broadcast_port)
        self.installed = -1
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.wait(0.05):
                self.install_newest()
        except Exception as error:  # reported on /health
            self.error = error

    def install_newest(self) -> None:
        versions = [
            int(match.group(1))
            for file in (self.spool.iterdir() if self.spool.is_dir() else [])
            if (match := VERSION_FILE.fullmatch(file.name))
        ]
        newest = max(versions, default=-1)
        if newest <= self.installed:
            return
        parameters = dict(self.target.model.named_parameters())
        tensors = load_file(self.spool / f"step_{newest}.safetensors")
        staged = {name: t.to(parameters[name].dtype) for name, t in tensors.items()}
        self.target.apply_received(newest, staged, source="spool")
        self.installed = newest

    def stop(self) -> None:
        self._stop_event.set()


TRANSPORT = WeightTransport("spool", route=SpoolRoute, intake=SpoolIntake)
