"""The run's judge server, a fourth role of `asyncrl rl` (the `judge` section): `asyncrl infer`
with the judge model, its config in `configs/judge.yaml` (the `judge` section as an inference
config that loads no weights, `JudgeServerConfig.inference_config`), its log in
`logs/judge.log`, supervised and restarted like the inference server (it never finishes; a
restart reloads the same model). It binds where `judge.host` says (loopback by default) and
asks for the run's API key, the inference server's variable, unless the config names another.
Judge terms without a `base_url` were pointed at it when the config was read
(`config/rl_wiring.py`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from asyncrl.config.rl import RLConfig
from asyncrl.gpu_presence import gpu_count
from asyncrl.launch.roles import role_yaml
from asyncrl.launch.supervisor import RoleSpec
from asyncrl.run.layout import config_file, heartbeat_file, log_file

ROLE = "judge"


def judge_spec(
    config: RLConfig, output: Path, gpus: dict[str, str] | None = None
) -> RoleSpec | None:
    """How the judge server starts and restarts (None: the run has no `judge` section), its
    config, log and heartbeat in the output directory `output`; `gpus`: its
    CUDA_VISIBLE_DEVICES, if any (`gpu_placement.py`)."""
    if config.judge is None:
        return None
    path = config_file(output, ROLE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(role_yaml(config.judge.inference_config()))
    command = [sys.executable, "-m", "asyncrl.cli", "infer", str(path)]
    return RoleSpec(
        ROLE, command, command, log_file(output, ROLE), heartbeat_file(output, ROLE),
        {**judge_threads(), **(gpus or {})}, finishes=False,
    )  # fmt: skip


def judge_threads() -> dict[str, str]:
    """One CPU thread on a CPU-only machine: the judge answers short prompts beside the roles
    that share the cores (a user's own OMP_NUM_THREADS wins; GPU machines are left alone)."""
    if gpu_count() or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": "1"}


def judge_url(config: RLConfig) -> str:
    assert config.judge is not None
    host = config.judge.host
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{config.judge.port}"
