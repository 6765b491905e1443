#!/usr/bin/env bash
# Creates .venv and installs asyncrl with its dev extras (EXTRAS=dev,ray for more).
# On a machine without an NVIDIA GPU, torch==2.13.0's CPU build goes in first, from pip's
# configured sources where they hold it and from PyTorch's CPU index otherwise
# (scripts/torch_source.py): on Linux the registry's plain `torch` is the CUDA build, 527 MB and
# some 2.2 GB of CUDA packages that a CPU never uses. With a GPU, the `torch` requirement takes
# the registry's CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
python="${PYTHON:-python3}"
# the versions CI passed with (constraints.txt); CONSTRAINTS= installs the newest instead
constraints="${CONSTRAINTS-constraints.txt}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
source scripts/install.sh
if ! command -v nvidia-smi >/dev/null 2>&1; then
    torch_sources "$venv" 2.13.0
    install "$venv" "${torch_args[@]}" "torch==2.13.0"
fi
# the lock: `make test` runs this beside setup_vllm.sh, and both editable builds write
# src/asyncrl.egg-info
pinned=()
if [ -n "$constraints" ]; then
    pinned=(-c "$constraints")
fi
(
    flock 9
    install "$venv" "${pinned[@]}" -e ".[${EXTRAS:-dev}]"
) 9<.
echo "asyncrl installed in $venv"
