"""Versions that travel as what changed: a server holding the base reads only the delta; every
other server — restarted, behind, holding another trainer's weights under the same number, or
racing two loads — gets the full version, and a delta is never applied to the wrong base."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.unit.inference.test_verified_loads import serve
from tests.unit.inference.weight_versions import publish, route, step, trained

from asyncrl.inference.served_model import ServedModel
from asyncrl.inference.weights import WeightLoadError
from asyncrl.transport.fingerprint import version_checksum, weights_fingerprint
from asyncrl.transport.weights.delta import DELTA_FILE
from asyncrl.transport.weights.manifest import read_manifest

LEARNING_RATE = 1e-5  # an RL step's size: few bfloat16 roundings move


@pytest.fixture
def bf16(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServedModel]:
    server = serve(tiny_model_dir, tmp_path, dtype="bfloat16")
    yield server
    server.engine.shutdown()


def served_checksum(served: ServedModel) -> str:
    return weights_fingerprint(served.engine.named_weights())


def expected_checksum(directory: Path) -> str:
    manifest = read_manifest(directory)
    assert manifest is not None
    checksums = manifest.checksums_at(torch.bfloat16)
    assert checksums is not None
    return version_checksum(checksums)


def three_versions(model_dir: Path, run_dir: Path, mode: str = "auto") -> list[Path]:
    """Steps 1-3 of one trainer serving bfloat16: step 1 full, then deltas."""
    files = route(model_dir, run_dir, "bfloat16", mode)
    model = trained(model_dir, seed=1)
    directories = [publish(files, 1, model)]
    for version in (2, 3):
        step(model, seed=version, scale=LEARNING_RATE)
        directories.append(publish(files, version, model))
    return directories


def test_a_server_holding_the_base_reads_only_the_delta_and_serves_the_trainers_weights(
    bf16: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    one, two, three = three_versions(tiny_model_dir, tmp_path)
    assert not (one / DELTA_FILE).exists() and (two / DELTA_FILE).exists()
    full = bf16.update_weights(str(one), None)
    delta = bf16.update_weights(str(two), None)
    assert (full.loaded, delta.loaded) == ("full", "delta")
    assert delta.bytes_read < full.bytes_read / 4
    assert delta.verified == delta.fingerprint == read_manifest(two).fingerprint  # type: ignore[union-attr]
    assert delta.checksum == served_checksum(bf16) == expected_checksum(two)
    again = bf16.update_weights(str(three), None)
    assert again.loaded == "delta" and served_checksum(bf16) == expected_checksum(three)
    assert again.weight_reloads == 0


def test_a_server_restarted_between_two_versions_gets_the_full_version(
    bf16: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A server that starts (or restarts) holds its own weights, not the delta's base."""
    _, two, _ = three_versions(tiny_model_dir, tmp_path)
    info = bf16.update_weights(str(two), None)
    assert info.loaded == "full" and served_checksum(bf16) == expected_checksum(two)


def test_a_server_that_skipped_a_version_gets_the_full_version(
    bf16: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Version 3 is a delta on 2; a server that went from 1 straight to 3 reads it whole."""
    one, _, three = three_versions(tiny_model_dir, tmp_path)
    bf16.update_weights(str(one), None)
    info = bf16.update_weights(str(three), None)
    assert info.loaded == "full" and served_checksum(bf16) == expected_checksum(three)


def test_a_delta_is_never_applied_to_other_weights_under_its_base_number(
    bf16: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The server holds version 1 of a trainer that then restarted from an earlier checkpoint
    and wrote its own version 1 and a delta on it: same step, other weights."""
    stale = publish(route(tiny_model_dir, tmp_path / "dead"), 1, trained(tiny_model_dir, seed=9))
    bf16.update_weights(str(stale), None)
    _, two, _ = three_versions(tiny_model_dir, tmp_path / "resumed")
    info = bf16.update_weights(str(two), None)
    assert info.loaded == "full" and served_checksum(bf16) == expected_checksum(two)
    os.remove(two / "model.safetensors")  # a delta alone, on the wrong base: refused
    bf16.update_weights(str(stale), None)
    with pytest.raises(WeightLoadError):
        bf16.update_weights(str(two), None)
    assert bf16.info().version == 1 and bf16.info().fingerprint == read_manifest(stale).fingerprint  # type: ignore[union-attr]


def test_a_delta_that_does_not_check_falls_back_to_the_full_version_and_counts_a_reload(
    bf16: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    one, two, _ = three_versions(tiny_model_dir, tmp_path)
    bf16.update_weights(str(one), None)
    data = bytearray((two / DELTA_FILE).read_bytes())
    data[-5] ^= 0x10  # inside the last blob's compressed stream
    (two / DELTA_FILE).write_bytes(bytes(data))
    info = bf16.update_weights(str(two), None)
    assert (info.loaded, info.weight_reloads) == ("full", 1)
    assert served_checksum(bf16) == expected_checksum(two)


def test_two_versions_racing_to_one_server_are_installed_whole_one_after_the_other(
    bf16: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Versions 2 and 3 (each a delta on the one before) loaded at once, again and again: each
    is applied to its own base or loaded in full, and what the server reports is what it
    serves."""
    one, two, three = three_versions(tiny_model_dir, tmp_path)
    for _ in range(3):
        bf16.update_weights(str(one), None)
        threads = [
            threading.Thread(target=bf16.update_weights, args=(str(d), None)) for d in (three, two)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        info = bf16.info()
        directory = {2: two, 3: three}[info.version]
        assert info.checksum == served_checksum(bf16) == expected_checksum(directory)
        assert info.verified == read_manifest(directory).fingerprint  # type: ignore[union-attr]


def test_float32_serving_sends_no_delta_under_auto_and_an_exact_one_when_on(
    served_fp32: ServedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    auto = three_versions_fp32(tiny_model_dir, tmp_path / "auto", "auto")
    assert not any((d / DELTA_FILE).exists() for d in auto)
    one, two, _ = three_versions_fp32(tiny_model_dir, tmp_path / "on", "on")
    served_fp32.update_weights(str(one), None)
    info = served_fp32.update_weights(str(two), None)
    assert info.loaded == "delta" and info.verified == read_manifest(two).fingerprint  # type: ignore[union-attr]
    assert served_checksum(served_fp32) == info.fingerprint  # float32: served as written


@pytest.fixture
def served_fp32(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ServedModel]:
    server = serve(tiny_model_dir, tmp_path)
    yield server
    server.engine.shutdown()


def three_versions_fp32(model_dir: Path, run_dir: Path, mode: str) -> list[Path]:
    files = route(model_dir, run_dir, "float32", mode)
    model = trained(model_dir, seed=1)
    directories = [publish(files, 1, model)]
    for version in (2, 3):
        step(model, seed=version, scale=LEARNING_RATE)
        directories.append(publish(files, version, model))
    return directories
