"""Your own data and reward through the `jsonl` environment: extra columns reach the reward, a
reward by import path, an explicit held-out file, and the `math` environment never trains on
generated problems unless asked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from asyncrl.envs import load_environment, score
from asyncrl.envs.registry import EnvironmentLoadError


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user's reward module on sys.path and PYTHONPATH (where the reward workers and the
    process that checks it at start-up find it), which records that it was imported."""
    (tmp_path / "my_rewards.py").write_text(
        "IMPORTED = True\n"
        "def by_column(completion, example):\n"
        "    return float(completion.strip() == example.info['expected'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    return "my_rewards:by_column"


def test_extra_columns_reach_a_reward_named_by_import_path(
    tmp_path: Path, reward_module: str
) -> None:
    data = write(tmp_path / "d.jsonl", [{"input": f"q{i}", "expected": f"e{i}", "level": i}
                                        for i in range(40)])  # fmt: skip
    env = load_environment("jsonl", {"path": str(data), "reward": reward_module})
    assert "my_rewards" not in sys.modules  # imported on the first call, in a reward worker
    example = env.examples("train", 1)[0]
    assert example.info == {"expected": f"e{example.info['level']}", "level": example.info["level"]}
    assert example.answer == ""  # no answer column: the user's reward does not need one
    assert score(env, example.info["expected"], example) == 1.0
    assert score(env, "something else", example) == 0.0
    assert [term.name for term in env.rubric] == ["by_column"]


def test_an_eval_file_is_the_whole_held_out_set_and_the_train_file_all_trained(
    tmp_path: Path,
) -> None:
    train = write(tmp_path / "train.jsonl", [{"input": f"t{i}", "answer": "a"} for i in range(9)])
    test = write(tmp_path / "test.jsonl", [{"input": f"e{i}", "answer": "a"} for i in range(3)])
    env = load_environment("jsonl", {"path": str(train), "eval_path": str(test)})
    held_out = {e.prompt[-1]["content"] for e in env.examples("eval", 6)}
    trained = {e.prompt[-1]["content"] for e in env.examples("train", 9)}
    assert held_out == {"e0", "e1", "e2"}  # every line, not one in eight
    assert trained == {f"t{i}" for i in range(9)}


def test_other_column_names_can_be_the_prompt_and_answer(tmp_path: Path) -> None:
    data = write(tmp_path / "d.jsonl", [{"question": "2+2?", "solution": "4", "src": "x"}])
    env = load_environment("jsonl", {"path": str(data), "input_key": "question",
                                     "answer_key": "solution", "eval_path": str(data)})  # fmt: skip
    example = env.examples("eval", 1)[0]
    assert (example.prompt[-1]["content"], example.answer, example.info) == (
        "2+2?",
        "4",
        {"src": "x"},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"reward": "no_such_module_here:f"}, r"no module `no_such_module_here` \(install it"),
        ({"reward": "fuzzy"}, r"reward must be one of \['exact', 'lcs', 'math'\] or a function"),
    ],
)
def test_a_reward_that_cannot_be_had_is_a_config_error(
    tmp_path: Path, args: dict, message: str
) -> None:
    data = write(tmp_path / "d.jsonl", [{"input": "q", "answer": "a"}])
    with pytest.raises(EnvironmentLoadError, match=message):
        load_environment("jsonl", {"path": str(data), **args})


def test_a_built_in_reward_needs_the_answer_column_and_says_where(tmp_path: Path) -> None:
    data = write(tmp_path / "d.jsonl", [{"input": "q", "answer": "a"}, {"input": "q2"}])
    with pytest.raises(EnvironmentLoadError, match=r"d\.jsonl:2: needs `answer`"):
        load_environment("jsonl", {"path": str(data)})


def test_math_without_data_is_refused_unless_generation_is_asked_for(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentLoadError, match=r"give `data_path`.*or `generate: true`"):
        load_environment("math")
    generated = load_environment("math", {"generate": True}).examples("train", 2)
    assert all(example.prompt[-1]["content"].startswith("Compute") for example in generated)
    data = write(tmp_path / "m.jsonl", [{"question": "1+1", "answer": "2"}])
    with pytest.raises(EnvironmentLoadError, match="not both"):
        load_environment("math", {"data_path": str(data), "generate": True})


def test_a_completions_file_naming_no_example_is_refused_by_line(tmp_path: Path) -> None:
    from asyncrl.config.score import ScoreConfig
    from asyncrl.envs.score_command import completions_for

    data = write(tmp_path / "d.jsonl", [{"input": "q", "answer": "a", "unit": "g"}])
    env = load_environment("jsonl", {"path": str(data), "eval_path": str(data)})
    examples = env.examples("eval", 2)
    config = {"env": {"id": "jsonl"}, "completions": ["{answer} {unit}"]}
    good = write(tmp_path / "c.jsonl", [{"completion": "x", "example": 1}, {"completion": "y"}])
    pairs = completions_for(ScoreConfig(**config, completions_file=str(good)), examples)
    assert pairs == [(0, "a g"), (1, "a g"), (1, "x"), (0, "y"), (1, "y")]
    for bad, message in (({"completion": "x", "example": "one"}, "must be a whole number"),
                         ({"completion": "x", "example": 5}, "not among the 2 examples"),
                         ({"text": "x"}, "needs a string `completion`")):  # fmt: skip
        path = write(tmp_path / "bad.jsonl", [bad])
        with pytest.raises(EnvironmentLoadError, match=rf"bad\.jsonl:1: .*{message}"):
            completions_for(ScoreConfig(**config, completions_file=str(path)), examples)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ("[1, 2]", "is a string, not a list of token ids"),
        (None, "is null"),
        ([], "is empty"),
        ([1, 2.5], r"`input_token_ids\[1\]` is 2.5, not a whole number"),
        ([1, True], r"`input_token_ids\[1\]` is True, not a whole number"),
        ([3, -1], r"`input_token_ids\[1\]` is -1, a negative token id"),
        ({"ids": [1]}, "is a dict, not a list"),
    ],
)
def test_token_ids_that_are_no_list_of_ids_are_refused_at_start_by_line(
    tmp_path: Path, ids: object, message: str
) -> None:
    """A string was sent as a raw text prompt; the rest were refused by the server each time
    the line was drawn, stopping the run."""
    data = write(tmp_path / "d.jsonl", [{"input_token_ids": [1, 2], "answer": "a"},
                                        {"input_token_ids": ids, "answer": "a"}])  # fmt: skip
    with pytest.raises(EnvironmentLoadError, match=rf"d\.jsonl:2: .*{message}"):
        load_environment("jsonl", {"path": str(data)})


def test_each_example_knows_the_line_it_came_from(tmp_path: Path) -> None:
    data = write(tmp_path / "d.jsonl", [{"input": f"q{i}", "answer": "a"} for i in range(3)])
    env = load_environment("jsonl", {"path": str(data), "eval_path": str(data)})
    sources = [example.source for example in env.examples("eval", 3)]
    assert sources == [f"{data}:1", f"{data}:2", f"{data}:3"]
    assert all("source" not in example.info for example in env.examples("eval", 3))


def test_a_misspelled_reward_function_is_a_config_error_naming_key_and_attribute(
    tmp_path: Path, reward_module: str
) -> None:
    """Only the top-level module was looked up: the typo passed start-up and every reward then
    scored 0. The module is imported in a process of its own, never in this one."""
    data = write(tmp_path / "d.jsonl", [{"input": "q", "expected": "e"}])
    with pytest.raises(
        EnvironmentLoadError, match=r"`reward: my_rewards:by_colum`: module `my_rewards` has no "
        r"attribute `by_colum` \(its functions: by_column\)"
    ):  # fmt: skip
        load_environment("jsonl", {"path": str(data), "reward": "my_rewards:by_colum"})
    assert "my_rewards" not in sys.modules


def test_a_reward_module_that_fails_to_import_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_rewards.py").write_text("import no_such_dependency_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    data = write(tmp_path / "d.jsonl", [{"input": "q", "expected": "e"}])
    with pytest.raises(EnvironmentLoadError, match=r"`reward: broken_rewards:f`: importing "
                       r"`broken_rewards` failed: ModuleNotFoundError"):  # fmt: skip
        load_environment("jsonl", {"path": str(data), "reward": "broken_rewards:f"})
