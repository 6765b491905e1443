"""What `make test`'s set-up costs with pip, with uv, and with uv compiling nothing in advance.

For each installer layout, a fresh `git clone` of this repository's HEAD runs `make -j2
test-deps vllm` (the two venvs side by side, as `make test` starts) with caches of its own,
empty, as on a new machine. Three layouts, their order rotated every seed:

- `pip`: pip installs and byte-compiles (`ASYNCRL_INSTALLER=pip`), as set-up did before uv;
- `uv`: uv installs and byte-compiles in parallel (`make setup`'s default);
- `uv-lazy`: uv compiles nothing (`ASYNCRL_COMPILE=0`, what `make test` uses); the tests then
  run with `PYTHONDONTWRITEBYTECODE` emptied and each module is compiled by its first importer.

The lazy layout moves compile time into the first processes, so each run then times one fresh
import of a trainer's modules (.venv) and one of vLLM's server (.venv-vllm), under the
environment the tests get: `first_imports_s`, and `total_s` is set-up plus those. Prints one
JSON line: each figure's mean and 95 % interval, and every layout ÷ pip with its interval.

    python benchmarks/setup_time.py [--seeds 3]

Downloads come from the package registries, so the network's speed is in every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from machine import cpu_name  # benchmarks/machine.py, beside this file
from race_stats import bootstrap_mean, bootstrap_ratio

REPO = Path(__file__).resolve().parent.parent
LAYOUTS: dict[str, dict[str, str]] = {
    "pip": {"ASYNCRL_INSTALLER": "pip", "ASYNCRL_COMPILE": "1"},
    "uv": {"ASYNCRL_INSTALLER": "uv", "ASYNCRL_COMPILE": "1"},
    "uv-lazy": {"ASYNCRL_INSTALLER": "uv", "ASYNCRL_COMPILE": "0"},
}
TRAINER_IMPORTS = (
    "import asyncrl.cli, asyncrl.trainer.train, transformers.modeling_utils;"
    "from transformers import AutoModelForCausalLM, AutoTokenizer"
)
VLLM_IMPORTS = "import vllm.entrypoints.openai.api_server"


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def one_setup(layout: str, work: Path) -> dict[str, float]:
    """Clones, sets up both venvs with `layout`'s installer, then times the first imports."""
    clone = work / f"clone-{layout}"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    env = {
        **os.environ, **LAYOUTS[layout],
        "UV_CACHE_DIR": str(work / "uv-cache"), "PIP_CACHE_DIR": str(work / "pip-cache"),
    }  # fmt: skip
    cpu_before = children_cpu_s()
    setup_s = timed(["make", "-j2", "test-deps", "vllm"], clone, env)
    cpu_s = children_cpu_s() - cpu_before
    if LAYOUTS[layout]["ASYNCRL_COMPILE"] == "0":
        env["PYTHONDONTWRITEBYTECODE"] = ""  # as `make test` runs its tests
    imports_s = timed([".venv/bin/python", "-c", TRAINER_IMPORTS], clone, env) + timed(
        [".venv-vllm/bin/python", "-c", VLLM_IMPORTS], clone, env
    )
    shutil.rmtree(clone)
    for cache in ("uv-cache", "pip-cache"):
        shutil.rmtree(work / cache, ignore_errors=True)
    return {
        "setup_s": setup_s, "cpu_s": cpu_s, "first_imports_s": imports_s,
        "total_s": setup_s + imports_s,
    }  # fmt: skip


def summary(runs: dict[str, list[dict[str, float]]], key: str) -> dict[str, object]:
    figures: dict[str, object] = {}
    for layout, values in runs.items():
        figures[layout] = [round(x, 2) for x in bootstrap_mean([r[key] for r in values])]
        if layout != "pip":
            ratio = bootstrap_ratio([r[key] for r in values], [r[key] for r in runs["pip"]])
            figures[f"{layout}/pip"] = [round(x, 3) for x in ratio]
    return figures


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    return parser


def main() -> None:
    args = parser().parse_args()
    work = Path(tempfile.mkdtemp(prefix="asyncrl-setup-time-"))
    names = list(LAYOUTS)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    try:
        for seed in range(args.seeds):
            for layout in names[seed % 3 :] + names[: seed % 3]:
                runs[layout].append(one_setup(layout, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    print(json.dumps({
        "benchmark": "setup_time", "cpu": cpu_name(), "commit": commit, "seeds": args.seeds,
        **{key: summary(runs, key) for key in ("setup_s", "cpu_s", "first_imports_s", "total_s")},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
