"""The launcher of `asyncrl rl` (local and Ray) starts without torch: it only reads configs and
run directories, and importing torch costs 1.4 s of CPU (AMD EPYC Zen 4) and ~300 MB in a
process that lives as long as the run. torch loads where tensors are: the roles, and the
launcher's bf16 probe when a run's recipe is `auto`."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["asyncrl.launch.local", "asyncrl.launch.ray"])
def test_the_launcher_imports_no_torch(module: str) -> None:
    check = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('torch')))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", f"{module} imports torch: {result.stdout[:300]}"
