"""Which sources set-up takes torch from (scripts/torch_source.py), decided without a network:
fake `pip config list` outputs and machines for the rule, real folders and index pages for
what a configured source holds, and the script itself, run by `install.sh`'s `torch_sources`
with pip's configuration replaced by the test's (PIP_CONFIG_FILE=/dev/null, PIP_* variables)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torch_source", ROOT / "scripts/torch_source.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


torch_source = _load()
LINUX_CPU = torch_source.Machine(
    nvidia_gpu=False, system="Linux", machine="x86_64", python_tag="cp311"
)


def sources(pip_config: str, machine: object = LINUX_CPU, **environ: str) -> list[str]:
    return torch_source.torch_sources("2.13.0", pip_config, machine, environ)[0]


def test_a_stock_linux_machine_without_a_gpu_adds_pytorchs_cpu_index() -> None:
    assert sources("") == ["--extra-index-url", CPU_INDEX]
    assert sources("global.index-url='https://pypi.org/simple'\n") == [
        "--extra-index-url",
        CPU_INDEX,
    ]


def test_a_gpu_takes_the_registry_as_configured() -> None:
    gpu = torch_source.Machine(True, "Linux", "x86_64", "cp311")
    assert sources("", gpu) == []


def test_macos_and_windows_take_the_registry_whose_torch_is_a_cpu_build() -> None:
    for system in ("Darwin", "Windows"):
        machine = torch_source.Machine(False, system, "arm64", "cp311")
        assert sources("", machine) == []


def test_this_machines_config_a_find_links_folder_with_the_wheel_is_used_as_it_is(
    tmp_path: Path,
) -> None:
    """The shape of this project's machines: a local wheel in a find-links folder (from a pip
    config file and PIP_FIND_LINKS), local indexes beside it, no internet."""
    wheels, index = tmp_path / "wheels", tmp_path / "pypi" / "simple"
    wheels.mkdir()
    index.mkdir(parents=True)
    (wheels / WHEEL).touch()
    config = (
        f":env:.find-links='{wheels}'\n"
        f"global.extra-index-url='file://{index} file:///opt/elsewhere/simple'\n"
        "global.constraint='/etc/xdg/pip/constraints.txt'\n"
    )
    assert sources(config) == []


def test_a_cpu_wheel_of_another_version_python_or_machine_does_not_count(tmp_path: Path) -> None:
    for name in (
        "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_aarch64.whl",
        "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",  # the registry's CUDA build
    ):
        (tmp_path / name).touch()
    assert sources(f"global.find-links='{tmp_path}'") == ["--extra-index-url", CPU_INDEX]


def test_a_local_simple_index_that_links_the_cpu_wheel_is_used_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    href = WHEEL.replace("+", "%2B")
    (tmp_path / "torch" / "index.html").write_text(f'<a href="../../files/{href}#sha256=0">x</a>')
    assert sources(f"user.index-url='file://{tmp_path}'") == []


def test_pytorchs_cpu_index_or_a_mirror_of_it_already_configured_is_used_as_it_is() -> None:
    assert sources(f"global.extra-index-url='{CPU_INDEX}'") == []
    assert sources("global.index-url='https://mirror.example/pytorch/whl/cpu/'") == []
    # a CUDA index of PyTorch's does not hold the CPU build
    cuda = "global.extra-index-url='https://download.pytorch.org/whl/cu130'"
    assert sources(cuda) == ["--extra-index-url", CPU_INDEX]


def test_asyncrl_torch_index_overrides_the_rule() -> None:
    assert sources("", ASYNCRL_TORCH_INDEX="registry") == []
    mirror = "https://mirror.example/whl/cpu"
    gpu = torch_source.Machine(True, "Linux", "x86_64", "cp311")
    assert sources("", gpu, ASYNCRL_TORCH_INDEX=mirror) == ["--extra-index-url", mirror]


def _torch_args(tmp_path: Path, environ: dict[str, str]) -> list[str]:
    """`torch_sources VENV 2.13.0` of install.sh, its venv's python this one, under `environ`."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    script = (
        'source scripts/install.sh; torch_sources "$1" 2.13.0; printf "%s\\n" "${torch_args[@]}"'
    )
    result = subprocess.run(
        ["bash", "-c", script, "bash", str(venv)],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stderr.startswith("torch: "), result.stderr  # the reason, for the set-up log
    return [line for line in result.stdout.splitlines() if line]


def test_install_sh_reads_pips_real_configuration_without_a_network(tmp_path: Path) -> None:
    """The script run as set-up runs it: pip's own `pip config list`, only the test's sources."""
    if sys.version_info[:2] != (3, 11) or os.uname().machine != "x86_64":
        pytest.skip("the stand-in wheel is named for CPython 3.11 on x86_64")
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PIP_", "ASYNCRL_TORCH"))
    }
    base |= {"PIP_CONFIG_FILE": os.devnull, "PATH": "/usr/bin:/bin"}
    assert _torch_args(tmp_path / "stock", base) == ["--extra-index-url", CPU_INDEX]

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / WHEEL).touch()
    local = base | {"PIP_FIND_LINKS": str(wheels)}
    assert _torch_args(tmp_path / "local", local) == []

    fake_gpu = tmp_path / "gpu_bin"  # a stand-in nvidia-smi: this machine has no GPU
    fake_gpu.mkdir()
    (fake_gpu / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (fake_gpu / "nvidia-smi").chmod(0o755)
    gpu = base | {"PATH": f"{fake_gpu}:/usr/bin:/bin"}
    assert _torch_args(tmp_path / "gpu", gpu) == []
