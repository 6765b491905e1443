from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.launch.inference_process import inference_server


@pytest.fixture(scope="session")
def weight_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The only directory the shared server may read weight updates from."""
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="session")
def server_url(tiny_model_dir: Path, weight_root: Path) -> Iterator[str]:
    """One embedded server for the read-only tests of the session."""
    with inference_server(
        tiny_model_dir,
        "--max_model_len", "256",
        "--weight_roots", f"[{weight_root}]",
        "--max_request_bytes", "65536",
    ) as url:  # fmt: skip
        yield url
