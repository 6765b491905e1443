#!/usr/bin/env bash
# Creates .venv and installs asyncrl with its dev extras (EXTRAS=dev,ray for more).
# On a machine without an NVIDIA GPU, torch==2.13.0 (CPU build) goes in first: a plain `torch`
# requirement would otherwise pull several GB of CUDA packages from the registry.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
python="${PYTHON:-python3}"
# the versions CI passed with (constraints.txt); CONSTRAINTS= installs the newest instead
constraints="${CONSTRAINTS-constraints.txt}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
# pip byte-compiles what it installs, and must: where PYTHONDONTWRITEBYTECODE is set (this
# machine kind sets it) Python never writes .pyc itself, and with `--no-compile` every process
# compiled torch and vLLM again (set-up 52 s shorter, the tests at under half their pace)
pip=("$venv/bin/python" -m pip install --quiet)
# pip warns once per package about unused local index folders; keep the log readable
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
if ! command -v nvidia-smi >/dev/null 2>&1; then
    quiet "${pip[@]}" "torch==2.13.0"
fi
# the lock: `make test` runs this beside setup_vllm.sh, and both editable builds write
# src/asyncrl.egg-info
pinned=()
if [ -n "$constraints" ]; then
    pinned=(-c "$constraints")
fi
quiet flock . "${pip[@]}" "${pinned[@]}" -e ".[${EXTRAS:-dev}]"
echo "asyncrl installed in $venv"
