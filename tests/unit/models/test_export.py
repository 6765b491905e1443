"""`asyncrl export` and the paths it is given: it never removes what is at its output or what it
reads, writes through a symlinked output, and reads a run's config only from a run's layout.
That an export loads anywhere with the run's weights is `tests/contract/test_export.py`'s."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from asyncrl.config.base import ConfigError
from asyncrl.config.export import ExportConfig
from asyncrl.models.export import base_of, export, run_export

MARKER = "asyncrl_export.json"


@pytest.fixture
def run(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """An output directory as `asyncrl rl` leaves it: the trainer's config, and a complete
    full-weights broadcast of the tiny model (no tokenizer, as the trainer writes it)."""
    output = tmp_path / "out"
    broadcast = output / "run_default" / "broadcasts" / "step_2"
    shutil.copytree(tiny_model_dir, broadcast)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (broadcast / name).unlink(missing_ok=True)
    (broadcast / "STABLE").write_text("{}")
    (output / "configs").mkdir()
    trainer = {"model": str(tiny_model_dir), "run_name": "default"}
    (output / "configs" / "train.yaml").write_text(yaml.safe_dump(trainer))
    (output / "run_default" / "metrics.jsonl").write_text("{}\n")
    return output


def files(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


def test_an_output_holding_other_files_is_refused_not_replaced(run: Path, tmp_path: Path) -> None:
    """`--output_dir models` swapped `models` for the export and removed every other model."""
    models = tmp_path / "models"
    (models / "other-model").mkdir(parents=True)
    (models / "other-model" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"output_dir .*models is not empty \(other-model\) and "
                       r"is not an earlier output of asyncrl export"):  # fmt: skip
        export(ExportConfig(source=str(run), output_dir=str(models)))
    assert files(models) == ["other-model", "other-model/config.json"]


@pytest.mark.parametrize("output", ["out", "out/run_default", "out/run_default/broadcasts/step_2"])
def test_an_output_at_or_above_the_run_it_reads_is_refused(
    output: str, run: Path, tmp_path: Path
) -> None:
    """An export whose output was the run it read removed the run: checkpoints, broadcasts,
    logs."""
    before = files(run)
    with pytest.raises(ValueError, match=r"(is|holds) what asyncrl export reads"):
        export(ExportConfig(source=str(run), output_dir=str(tmp_path / output)))
    assert files(run) == before


def test_an_earlier_export_is_replaced_unless_something_was_added_to_it(
    run: Path, tmp_path: Path
) -> None:
    config = ExportConfig(source=str(run), output_dir=str(tmp_path / "exported"))
    export(config)
    export(config.model_copy(update={"dtype": "bfloat16"}))  # its own earlier output: replaced
    assert json.loads((tmp_path / "exported" / MARKER).read_text())["dtype"] == "bfloat16"
    (tmp_path / "exported" / "eval-results.json").write_text("{}")
    with pytest.raises(ValueError, match=r"also holds eval-results\.json, which it did not write"):
        export(config)
    assert (tmp_path / "exported" / "eval-results.json").is_file()


def test_a_symlinked_output_is_written_through_with_ordinary_permissions(
    run: Path, tmp_path: Path
) -> None:
    """The link was replaced by a real directory of mode 0700 (mkdtemp's)."""
    real = tmp_path / "big-disk" / "exported"
    real.parent.mkdir()
    link = tmp_path / "exported"
    link.symlink_to(real, target_is_directory=True)
    previous = os.umask(0o022)
    try:
        export(ExportConfig(source=str(run), output_dir=str(link)))
    finally:
        os.umask(previous)
    assert link.is_symlink() and (real / "config.json").is_file() and (real / MARKER).is_file()
    assert stat.S_IMODE(real.stat().st_mode) == 0o755


def test_what_a_killed_export_left_is_removed_at_the_next_start(run: Path, tmp_path: Path) -> None:
    left = [f".exported.asyncrl-output.{'0123abcd' * 4}.tmp",
            f".exported.asyncrl-output-old.{'0123abcd' * 4}.tmp"]  # fmt: skip
    for name in left:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half")
    export(ExportConfig(source=str(run), output_dir=str(tmp_path / "exported")))
    assert not {p.name for p in tmp_path.iterdir()} & set(left)


def test_a_refused_output_is_a_config_error(run: Path, tmp_path: Path) -> None:
    """The command says it in one line (`asyncrl export: output_dir …`, exit 2), as it says a
    wrong setting."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"^output_dir .*models is not empty \(keep\.txt\)"):
        run_export(ExportConfig(source=str(run), output_dir=str(tmp_path / "models")))
    assert (tmp_path / "models" / "keep.txt").is_file()


# --- the run's config: read only where the broadcast is in its run ------------------------------


def adapter(directory: Path, base: str) -> dict:
    directory.mkdir(parents=True)
    config = {"peft_type": "LORA", "base_model_name_or_path": base}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    (directory / "STABLE").write_text("{}")
    return config


def trainer_config(output_dir: Path, model: str, run_name: str = "default") -> None:
    (output_dir / "configs").mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({"model": model, "run_name": run_name})
    (output_dir / "configs" / "train.yaml").write_text(text)


@pytest.mark.parametrize(
    "where", ["downloads/a/step_3", "out/run_default/step_3", "out/run_other/broadcasts/step_3"]
)
def test_a_broadcast_outside_its_run_reads_no_config_above_it(where: str, tmp_path: Path) -> None:
    """A broadcast given directly had `configs/train.yaml` three levels above it read as its
    run's: a copied adapter took whatever model that unrelated file named as its base."""
    broadcast = tmp_path / where
    config = adapter(broadcast, base="adapter-base")
    for output_dir in (tmp_path, tmp_path / "out"):
        trainer_config(output_dir, model="unrelated-model")
    export_config = ExportConfig(source=str(broadcast), output_dir=str(tmp_path / "exported"))
    assert base_of(export_config, broadcast, config) == "adapter-base"


def test_a_broadcast_in_its_run_takes_the_runs_model(tmp_path: Path) -> None:
    broadcast = tmp_path / "out" / "run_x" / "broadcasts" / "step_3"
    config = adapter(broadcast, base="adapter-base")
    trainer_config(tmp_path / "out", model="the-runs-model", run_name="x")
    export_config = ExportConfig(source=str(broadcast), output_dir=str(tmp_path / "exported"))
    assert base_of(export_config, broadcast, config) == "the-runs-model"
    named = export_config.model_copy(update={"base_model": "mine"})
    assert base_of(named, broadcast, config) == "mine"


def test_an_adapter_with_no_known_base_asks_for_base_model(tmp_path: Path) -> None:
    broadcast = tmp_path / "downloads" / "step_3"
    adapter(broadcast, base="")
    trainer_config(tmp_path, model="unrelated-model")
    with pytest.raises(ConfigError, match=r"not in a run's .* set base_model"):
        export(ExportConfig(source=str(broadcast), output_dir=str(tmp_path / "exported")))
    assert not (tmp_path / "exported").exists()
