"""What every benchmark prints beside its figures: the CPU it ran on (these machines vary)."""

from __future__ import annotations

import platform
import subprocess


def cpu_name() -> str:
    """lscpu's model name, family and model, and which vector units it has."""
    fields = {}
    try:
        output = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor() or "unknown"
    for line in output.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("Flags", "").split())
    vector = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if flag in flags]
    return (f"{fields.get('Model name', 'unknown')} (family {fields.get('CPU family', '?')} "
            f"model {fields.get('Model', '?')}; {' '.join(vector)})")  # fmt: skip
