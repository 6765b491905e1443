#!/usr/bin/env bash
# The GPU check in one command, on a machine with an NVIDIA GPU: what the device and its
# software are, then tests/gpu (the CUDA trainer and engine through `asyncrl rl` on policy,
# packing with SDPA and flash-attention) with their figures. Run from a checkout:
#   bash scripts/gpu_check.sh            # with .venv's python, else python3
# ASYNCRL_GPU_MODEL: the model folder (default models/smollm2-135m-instruct, `make smollm2`);
# a folder of config and tokenizer only gives a model of that shape with random weights.
# PYTEST_WORKERS (default 4): tests run at once (pytest-xdist), each engine with 2 GiB of KV.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || exit 1
"$PYTHON" - <<'PY'
import importlib.util, torch, transformers
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}")
print(f"{torch.cuda.get_device_name()}: {torch.cuda.get_device_properties(0).multi_processor_count} SMs")
for name in ("flash_attn", "vllm", "sglang"):
    found = importlib.util.find_spec(name) is not None
    print(f"{name}: {'installed' if found else 'NOT installed: its checks do not run'}")
print(f"GPUs: {torch.cuda.device_count()}"
      + ("" if torch.cuda.device_count() > 1 else
         " (NCCL weight broadcast needs two: NCCL refuses two ranks on one device; not run)"))
PY
echo "== tests/gpu"
workers=${PYTEST_WORKERS:-4}
xdist=$("$PYTHON" -c "import xdist" 2>/dev/null && echo "-n $workers" || echo "")
# shellcheck disable=SC2086
"$PYTHON" -m pytest tests/gpu -m gpu -v -rA -p no:cacheprovider $xdist "$@"
