"""A server checks every version it loads against the trainer's manifest, at the dtype it serves,
and never serves one that does not check: real files written as the trainer writes them, damaged
on disk the ways disks and restarted writers damage them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.unit.inference.weight_versions import flip_bit, publish, route, tensor_span, trained

from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.served_model import ServedModel
from asyncrl.inference.server import load_served_model
from asyncrl.inference.weights import UnreadableWeights
from asyncrl.transport.fingerprint import weights_fingerprint
from asyncrl.transport.weights.manifest import WeightsMismatch, read_manifest

TENSOR = "model.layers.0.mlp.down_proj.weight"
EMBEDDING = "model.embed_tokens.weight"  # not laid out input-major: taken as stored


def serve(model_dir: Path, roots: Path, dtype: str = "float32") -> ServedModel:
    config = InferenceConfig(
        model=str(model_dir), max_model_len=256, weight_roots=[str(roots)], dtype=dtype
    )
    return load_served_model(config)


@pytest.fixture
def served(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServedModel]:
    server = serve(tiny_model_dir, tmp_path)
    yield server
    server.engine.shutdown()


def served_weights(served: ServedModel) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in served.engine.model.named_parameters()}


def test_a_version_is_checked_against_the_trainers_manifest_and_reported(
    served: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = trained(tiny_model_dir, seed=1)
    directory = publish(route(tiny_model_dir, tmp_path), 1, model)
    info = served.update_weights(str(directory), None)
    fingerprint = weights_fingerprint(model.named_parameters())
    assert info.version == 1 and info.verified == info.fingerprint == fingerprint
    assert info.loaded == "full" and info.bytes_read > 0 and info.weight_reloads == 0
    assert weights_fingerprint(served.engine.named_weights()) == fingerprint  # what it serves


def test_a_bit_flipped_in_a_broadcast_file_is_never_served_and_names_the_tensor(
    served: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    before, weights = served.info(), served_weights(served)
    directory = publish(route(tiny_model_dir, tmp_path), 1, trained(tiny_model_dir, seed=1))
    flip_bit(directory / "model.safetensors", TENSOR)
    with pytest.raises(WeightsMismatch, match=TENSOR) as error:
        served.update_weights(str(directory), None)
    assert error.value.tensors == [TENSOR]
    after = served.info()
    assert after.weight_reloads == 1  # read once more before giving up on it
    assert (after.version, after.fingerprint) == (before.version, before.fingerprint)
    for name, tensor in served_weights(served).items():
        assert torch.equal(tensor, weights[name]), name


def test_a_truncated_broadcast_file_is_read_once_more_then_refused(
    served: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    before = served.info()
    directory = publish(route(tiny_model_dir, tmp_path), 1, trained(tiny_model_dir, seed=1))
    file = directory / "model.safetensors"
    os.truncate(file, file.stat().st_size - 100)
    with pytest.raises(UnreadableWeights, match=r"model\.safetensors"):
        served.update_weights(str(directory), None)
    after = served.info()
    assert after.weight_reloads == 1 and after.fingerprint == before.fingerprint


def test_a_file_replaced_after_the_trainer_wrote_it_is_refused(
    served: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Another whole checkpoint of the same shapes put in its place (a second writer, a copy
    gone wrong): it reads fine, but it is not what the manifest says."""
    files = route(tiny_model_dir, tmp_path)
    directory = publish(files, 1, trained(tiny_model_dir, seed=1))
    other = trained(tiny_model_dir, seed=2)
    other.save_pretrained(tmp_path / "other")
    os.replace(tmp_path / "other" / "model.safetensors", directory / "model.safetensors")
    with pytest.raises(WeightsMismatch, match="not the trainer's weights"):
        served.update_weights(str(directory), None)
    assert served.info().version == 0


def test_a_file_changed_on_disk_after_loading_changes_nothing_served(
    served: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Files used to be mapped: the served embedding then was the file's pages, and bytes
    written into the file later were served."""
    directory = publish(route(tiny_model_dir, tmp_path), 1, trained(tiny_model_dir, seed=1))
    served.update_weights(str(directory), None)
    weights = served_weights(served)
    start, end = tensor_span(directory / "model.safetensors", EMBEDDING)
    with open(directory / "model.safetensors", "r+b") as handle:
        handle.seek(start)
        handle.write(b"\x7f" * (end - start))
    for name, tensor in served_weights(served).items():
        assert torch.equal(tensor, weights[name]), name


def test_a_bfloat16_server_checks_the_values_it_serves(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Float32 master weights served in bfloat16: the manifest's bfloat16 checksums are of the
    values served, after conversion; a manifest without them is checked as written."""
    served = serve(tiny_model_dir, tmp_path, dtype="bfloat16")
    try:
        model = trained(tiny_model_dir, seed=1)
        directory = publish(route(tiny_model_dir, tmp_path / "a", "bfloat16"), 1, model)
        manifest = read_manifest(directory)
        assert manifest is not None and manifest.checksums_at(torch.bfloat16) is not None
        info = served.update_weights(str(directory), None)
        assert info.verified == manifest.fingerprint and info.dtype == "bfloat16"
        assert info.checksum == weights_fingerprint(served.engine.named_weights())
        as_written = publish(route(tiny_model_dir, tmp_path / "b", "float32"), 2, model)
        again = served.update_weights(str(as_written), None)
        assert again.verified == manifest.fingerprint and again.checksum == info.checksum
    finally:
        served.engine.shutdown()


def test_a_directory_without_a_manifest_loads_unchecked(
    served: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A checkpoint a user points the server at (not a trainer's version) loads as before,
    reported as unchecked."""
    shutil.copytree(tiny_model_dir, tmp_path / "mine")
    info = served.update_weights(str(tmp_path / "mine"), 5)
    assert info.version == 5 and info.verified is None and info.loaded == "full"
