"""Chunked logprobs keep the [tokens × vocab] logits out of memory: measured, not assumed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROBE = Path(__file__).with_name("memory_probe.py")
LOGITS_BYTES = 4096 * 32768 * 4  # one float32 copy of the micro-batch's logits: 512 MiB


def peak_growth(chunk: int) -> int:
    result = subprocess.run(
        [sys.executable, str(PROBE), str(chunk)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return int(result.stdout.strip().splitlines()[-1])


def test_chunked_peak_is_below_unchunked_by_at_least_the_logits_size() -> None:
    unchunked = peak_growth(0)
    chunked = peak_growth(512)
    assert unchunked - chunked >= LOGITS_BYTES, (unchunked, chunked)
