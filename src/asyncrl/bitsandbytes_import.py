"""Importing bitsandbytes without its hub-kernel warning.

bitsandbytes is imported by asyncrl for QLoRA and the 8-bit optimizer, and by peft whenever it
is installed (`peft/helpers.py` imports it at `import peft`), so every LoRA run and every
evaluation of a LoRA adapter imports it too. On a CPU with AVX512-BF16 that import tries the
`kernels` package, which fetches compiled code from the Hugging Face hub, for a faster 4-bit
CPU matmul, and where it is missing logs "Failed to load CPU gemm_4bit_forward from
kernels-community …". asyncrl fetches no code at run time and its paths never use that kernel
(LoRA has no 4-bit layer; QLoRA dequantizes, then multiplies: `trainer/quantized_base.py`), so
the warning is noise from a path the run does not take. Every import of peft or bitsandbytes in
asyncrl goes through `quiet_bitsandbytes_import`, which drops that one message while the import
runs and nothing else.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

KERNELS_LOGGER = "bitsandbytes.backends.cpu.ops"
KERNELS_WARNING = "Failed to load CPU gemm_4bit_forward from kernels-community"


def _not_the_kernels_warning(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(KERNELS_WARNING)


@contextlib.contextmanager
def quiet_bitsandbytes_import() -> Iterator[None]:
    """Within the block, bitsandbytes' hub-kernel warning is dropped (the message is logged once,
    when bitsandbytes is first imported); its other records pass."""
    logger = logging.getLogger(KERNELS_LOGGER)
    logger.addFilter(_not_the_kernels_warning)
    try:
        yield
    finally:
        logger.removeFilter(_not_the_kernels_warning)
