"""The launcher of `asyncrl rl` (local and Ray) decides without torch on a machine with no GPU:
it only reads configs and run directories and shares out cores, and importing torch costs 1.4 s
of CPU (AMD EPYC Zen 4) and ~300 MB in a process that lives as long as the run. torch loads
where tensors are: the roles, and the launcher's bf16 probe when a run's recipe is `auto`; and
with `role_start: fork` the local launcher imports it on purpose, once, for the roles it forks
(`launch/role_fork.py`), after these decisions.
The same holds for `asyncrl infer` as the parent of vLLM or SGLang, given an explicit dtype."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asyncrl.gpu_presence import could_have_gpus

# what the local launcher asks of the machine before it starts the roles
DECISIONS = (
    "from asyncrl.config.deployment import machine_deployment;"
    "from asyncrl.launch.local import thread_budget;"
    "from asyncrl.launch.judge_role import judge_threads;"
    "from asyncrl.launch.gpu_placement import visible_gpus;"
    "machine_deployment('local'); thread_budget(); judge_threads(); visible_gpus({})"
)
# what `asyncrl infer --backend vllm` decides before it starts vLLM (the command, the dtype)
EXTERNAL_ENGINE = (
    "import asyncrl.cli;"
    "from asyncrl.config.inference import InferenceConfig;"
    "from asyncrl.inference.external_engine import engine_command, external_engine_dtype;"
    "config = InferenceConfig(model='m', backend='vllm', dtype='float32');"
    "engine_command(config); external_engine_dtype(config)"
)


@pytest.mark.parametrize(
    "code", ["import asyncrl.launch.local", "import asyncrl.launch.ray", DECISIONS, EXTERNAL_ENGINE]
)
def test_the_launcher_runs_without_torch(code: str) -> None:
    if code == DECISIONS and could_have_gpus():
        pytest.skip("a GPU driver is present: the launcher asks torch how many GPUs it sees")
    check = f"{code}; import sys; print(sorted(m for m in sys.modules if m.startswith('torch')))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", f"torch imported: {result.stdout[:300]}"
