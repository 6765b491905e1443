"""The real-model quick start prints nothing from bitsandbytes' hub-kernel probe: peft imports
bitsandbytes where it is installed, and on an AVX512-BF16 CPU that import logged "Failed to load
CPU gemm_4bit_forward from kernels-community" in every LoRA trainer and every evaluation.

Each path runs in a fresh process (bitsandbytes logs once, at its first import), as the quick
start's commands do: `asyncrl eval` of the model before RL, the trainer's LoRA model, and
`asyncrl eval` of the LoRA broadcast after RL. The message can only appear where bitsandbytes is
installed on an AVX512-BF16 CPU (most of this project's machines); elsewhere these pass as is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.bitsandbytes_import import KERNELS_WARNING

pytestmark = pytest.mark.slow

# `asyncrl eval` of the model before RL, then the trainer's LoRA model (saved as the adapter a
# broadcast holds): the eval imports neither peft nor bitsandbytes, so the trainer's is the
# process's first import of them
BEFORE_AND_TRAINER = """
import sys
from asyncrl.evaluate import load_policy
load_policy(sys.argv[1], None, None, False)
print(sorted(name for name in ("peft", "bitsandbytes") if name in sys.modules), flush=True)
from asyncrl.config.training import TrainingConfig
from asyncrl.trainer.model import load_model
load_model(TrainingConfig(model=sys.argv[1], lora=True, recipe="fp32")).save_pretrained(sys.argv[2])
"""
# `asyncrl eval` of the LoRA broadcast after RL, in a process of its own
AFTER = """
import sys
from asyncrl.evaluate import load_policy
load_policy(sys.argv[1], sys.argv[2], sys.argv[2], False)
print(sorted(name for name in ("peft", "bitsandbytes") if name in sys.modules))
"""


def _run(script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *arguments],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env=os.environ | {"PYTHONWARNINGS": "ignore"},  # third-party SyntaxWarnings aside
    )


def test_the_quick_starts_commands_log_nothing_from_bitsandbytes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    adapter = tmp_path / "adapter"
    before_and_trainer = _run(BEFORE_AND_TRAINER, str(tiny_model_dir), str(adapter))
    assert KERNELS_WARNING not in before_and_trainer.stderr, before_and_trainer.stderr
    # a full model's evaluation imports neither
    assert before_and_trainer.stdout.splitlines()[-1] == "[]", before_and_trainer.stdout

    after = _run(AFTER, str(adapter), str(tiny_model_dir))
    assert KERNELS_WARNING not in after.stderr, after.stderr
    assert "'peft'" in after.stdout.splitlines()[-1]


def test_only_the_kernels_warning_is_dropped_and_only_within_the_block() -> None:
    import logging

    from asyncrl.bitsandbytes_import import KERNELS_LOGGER, quiet_bitsandbytes_import

    logger = logging.getLogger(KERNELS_LOGGER)
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect()
    logger.addHandler(handler)
    try:
        with quiet_bitsandbytes_import():
            logger.warning("%s: No module named 'kernels'", KERNELS_WARNING)
            logger.warning("another warning")
        logger.warning("%s: after the import", KERNELS_WARNING)
    finally:
        logger.removeHandler(handler)
    assert seen == ["another warning", f"{KERNELS_WARNING}: after the import"]
