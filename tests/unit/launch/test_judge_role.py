"""The judge role of `asyncrl rl`: the config it is started with is an inference config the
judge server reads back, with its own keys and no way to load weights."""

from __future__ import annotations

from pathlib import Path

from asyncrl.config.inference import InferenceConfig
from asyncrl.config.loading import load_config
from asyncrl.config.rl import RLConfig
from asyncrl.launch.judge_role import judge_spec


def test_the_judge_starts_as_asyncrl_infer_with_its_keys_and_no_weight_roots(
    tmp_path: Path,
) -> None:
    overrides = ["--model", "m", "--output_dir", str(tmp_path), "--inference.port", "8500",
                 "--judge.model", "judge-model", "--judge.max_model_len", "256"]  # fmt: skip
    config = load_config(RLConfig, [], overrides)
    spec = judge_spec(config, tmp_path)
    assert spec is not None
    path = Path(spec.command[-1])
    assert spec.command[-2:] == ["infer", str(path)]
    served = load_config(InferenceConfig, [str(path)])  # as `asyncrl infer` reads it
    assert (served.model, served.port, served.max_model_len) == ("judge-model", 8501, 256)
    assert (served.weight_roots, served.enable_lora) == ([], False)


def test_a_run_without_a_judge_section_starts_no_judge(tmp_path: Path) -> None:
    config = load_config(RLConfig, [], ["--model", "m", "--output_dir", str(tmp_path)])
    assert judge_spec(config, tmp_path) is None
