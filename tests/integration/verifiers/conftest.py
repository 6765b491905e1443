"""verifiers environments run by asyncrl's pieces against a real engine: SmolLM2-135M-Instruct
served by `asyncrl infer` (float32), the orchestrator's token gate on 127.0.0.1, and the
environment's worker processes. The environments are verifiers' own test fixtures (vendored in
`fixtures/`, MIT) and asyncrl's own ones for what must go wrong (`fixtures/faulty_v1.py`...).

Every test here needs the `verifiers` extra; without it they are skipped, saying so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.launch.inference_process import inference_server

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SEQ_LEN = 1024
NEEDS_VERIFIERS = "the verifiers extra is not installed (`pip install -e '.[verifiers]'`)"


@pytest.fixture(scope="session")
def verifiers_fixtures() -> Iterator[Path]:
    """The fixture environments importable by name in the worker processes (their
    environment is this one's, less the run's keys)."""
    pytest.importorskip("verifiers", reason=NEEDS_VERIFIERS)
    before = os.environ.get("PYTHONPATH")
    paths = [str(FIXTURES), str(FIXTURES / "vendored"), before]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    yield FIXTURES
    if before is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before


@pytest.fixture(scope="session")
def smollm2_server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`asyncrl infer` serving SmolLM2 in float32, for every test of this folder."""
    pytest.importorskip("verifiers", reason=NEEDS_VERIFIERS)
    log = tmp_path_factory.mktemp("verifiers-engine") / "infer.log"
    with inference_server(
        smollm2_dir, "--dtype", "float32", "--max_model_len", str(SEQ_LEN),
        "--max_num_seqs", "16", log_path=log, startup_timeout=600,
    ) as url:  # fmt: skip
        yield url
