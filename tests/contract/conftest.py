"""One engine contract, run against every engine on the same tiny model.

Each engine is started the way users start it, `asyncrl infer --backend NAME`, and reached over
real HTTP. vLLM runs from its own venv (`make vllm` makes `.venv-vllm`; `ASYNCRL_VLLM_PYTHON`
points elsewhere). Without it the vLLM half is skipped, unless `ASYNCRL_REQUIRE_VLLM=1` (CI
sets it), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from asyncrl.config.init_model import InitModelConfig
from asyncrl.launch.inference_process import inference_server
from asyncrl.models.init_model import init_model

REPO = Path(__file__).resolve().parents[2]
ENGINES = ["embedded", "vllm"]


@dataclass(frozen=True)
class Engine:
    name: str
    url: str  # http://127.0.0.1:PORT
    model: str  # the served model name
    model_dir: Path
    weight_root: Path  # where this engine may read weight updates from


def vllm_python() -> str | None:
    configured = os.environ.get("ASYNCRL_VLLM_PYTHON")
    if configured:
        return configured
    default = REPO / ".venv-vllm" / "bin" / "python"
    return str(default) if default.exists() else None


def required_vllm_python() -> str:
    """The vLLM interpreter; without one, skip, or fail when ASYNCRL_REQUIRE_VLLM=1."""
    python = vllm_python()
    if python is None:
        message = "no vLLM venv (run `make vllm` or set ASYNCRL_VLLM_PYTHON)"
        if os.environ.get("ASYNCRL_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def contract_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("contract")


def tiny_model(output: Path, seed: int = 0, tied: bool = False) -> Path:
    """Untied unless asked: a tied head is a case of its own (`test_reload_of_a_tied_lm_head`,
    the real-model tests), and untied models keep every other check independent of it."""
    config = InitModelConfig(
        preset="tiny", arch="llama", seed=seed, tie_word_embeddings=tied, output_dir=str(output)
    )
    return output if output.exists() else init_model(config)


@pytest.fixture(scope="session")
def base_model_dir(contract_root: Path) -> Path:
    """The tiny model, inside the weight root so tests may reload it."""
    return tiny_model(contract_root / "weights" / "base")


@contextmanager
def running(
    name: str, model_dir: Path, weight_root: Path, log: Path, env: dict[str, str] | None = None
) -> Iterator[Engine]:
    """`asyncrl infer --backend NAME` on `model_dir`, allowed to reload from `weight_root`
    (`env`: added to its environment)."""
    args = ["--dtype", "float32", "--max_model_len", "256", "--max_lora_rank", "8"]
    args += ["--weight_roots", f"[{weight_root}]"]
    if name == "vllm":
        args += ["--backend", "vllm", "--executable", required_vllm_python(),
                 "--enforce_eager", "true", "--kv_cache_memory_bytes", str(128 << 20),
                 "--max_num_seqs", "64"]  # fmt: skip
    with inference_server(model_dir, *args, env=env, log_path=log, startup_timeout=600) as url:
        yield Engine(name, url, str(model_dir), model_dir, weight_root)


# the servers `engine` started, stopped once the contract's tests are done (see below)
_STARTED = ExitStack()


@pytest.fixture(scope="session", params=ENGINES)
def engine(
    request: pytest.FixtureRequest, base_model_dir: Path, contract_root: Path
) -> Iterator[Engine]:
    log = contract_root / f"{request.param}.log"
    yield _STARTED.enter_context(
        running(request.param, base_model_dir, contract_root / "weights", log)
    )
    _STARTED.close()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A session-scoped server lives until the session ends, so the last engine (vLLM: three
    processes, 2 GB, a few % of a core while idle) used to serve nobody through every later
    test, the Ray tests included. It stops when the next test is not one of the contract's."""
    if nextitem is None or Path(str(nextitem.path)).parent != Path(__file__).parent:
        _STARTED.close()


def run_rl(config: dict, tmp_path: Path, timeout: float = 1500) -> Path:
    """`asyncrl rl` on `config` (written to `tmp_path/rl.yaml`), with this folder's test
    environments importable (`test/tool-turns-env`); the run directory once it has finished.
    A run past `timeout` fails with the ends of its roles' logs, which say where it stood."""
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(config))
    here = Path(__file__).resolve().parent
    python_path = os.pathsep.join([str(here), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    output = Path(config["output_dir"])

    def logs() -> str:
        return "".join(
            f"\n== {p.name}\n{p.read_text()[-2000:]}" for p in sorted(output.glob("logs/*.log"))
        )

    try:
        result = subprocess.run(
            [sys.executable, "-m", "asyncrl.cli", "rl", str(path)], capture_output=True,
            text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": python_path},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"asyncrl rl still running after {timeout:.0f} s; its logs:{logs()}")
    assert result.returncode == 0, result.stderr[-2000:] + logs()
    return output / "run_default"
