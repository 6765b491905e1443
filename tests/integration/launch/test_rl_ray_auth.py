"""An actor that dies before it runs: the run stops naming why, not with "(no log)".

The condition CI met, made on purpose: a cluster started without authentication, and a
`~/.ray/auth_token` that appeared afterwards (a local Ray instance writes one), so a driver
joining with `address: auto` requires a token the cluster never sends; the cluster then destroys
every actor the driver creates, before any runs."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.launch.inference_process import free_port

from .test_rl_launcher import survivors
from .test_rl_ray import RAY, private_ray_env, ray_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def home_with_a_later_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cluster without authentication, then a token file in the HOME its drivers use."""
    home = tmp_path_factory.mktemp("ray-home")
    env = private_ray_env(home, RAY_AUTH_MODE="disabled")
    subprocess.run(
        [RAY, "start", "--head", f"--port={free_port()}", "--num-cpus=6",
         "--include-dashboard=false", "--disable-usage-stats", f"--object-store-memory={1 << 28}"],
        check=True, capture_output=True, timeout=120, env=env,
    )  # fmt: skip
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("a0" * 32)
    try:
        yield home
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120, env=env)


def test_actors_destroyed_before_they_run_stop_the_run_with_the_cause(
    home_with_a_later_token: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    output = tmp_path / "unborn"
    config = ray_config(tiny_model_dir, output)
    command = [sys.executable, "-m", "asyncrl.cli", "rl", str(config), "--ray.address", "auto",
               "--trainer.world_size", "1"]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300,
        env=private_ray_env(home_with_a_later_token),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert time.monotonic() - started < 120
    message = result.stderr
    assert "died before it ran" in message, message[-3000:]
    assert "(no log)" not in message
    assert "The actor died unexpectedly before finishing this task" in message  # Ray's words
    assert "refused to call back into it" in message  # read from the driver's own Ray log
    assert "Ray switched it on because ~/.ray/auth_token exists" in message
    assert "RAY_AUTH_MODE=disabled" in message  # the way out
    assert not survivors(str(output))
