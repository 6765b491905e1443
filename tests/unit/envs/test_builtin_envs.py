"""The other built-in environments: data, splits and rewards on hand-worked completions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.envs import load_environment, score
from asyncrl.envs.answers import ExpressionError, boxed, evaluate, last_number
from asyncrl.envs.countdown import check


@pytest.mark.parametrize("env_id", ["reverse-text", "arithmetic", "countdown", "math"])
def test_generated_splits_are_deterministic_and_disjoint(env_id: str) -> None:
    env = load_environment(env_id, {"generate": True} if env_id == "math" else {})
    train, again = env.examples("train", 200), env.examples("train", 200)
    assert train == again
    train_prompts = {json.dumps(e.prompt) for e in train}
    assert not train_prompts & {json.dumps(e.prompt) for e in env.examples("eval", 50)}


def test_answer_extraction() -> None:
    assert last_number("so 3 + 4 = 7, answer 12") == "12"
    assert last_number("no digits") is None
    assert boxed(r"thus \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert boxed(r"\boxed{1} then \boxed{2}") == "2"
    assert boxed("nothing") is None


def test_expressions_are_parsed_never_executed() -> None:
    assert evaluate("(3 + 5) * 2 / 4") == (4, [3, 5, 2, 4])
    for bad in ("__import__('os')", "2 ** 10", "1 / 0", "3 +", "-4 + 1"):
        with pytest.raises(ExpressionError):
            evaluate(bad)


def test_arithmetic_reward() -> None:
    env = load_environment("arithmetic", {"operations": "*"})
    example = env.examples("train", 1)[0]
    a, _, b = example.info["question"].split()
    assert score(env, f"The product is {int(a) * int(b)}", example) == 1.0
    assert score(env, f"{int(a) * int(b) + 1}", example) == 0.0


def test_countdown_reward_needs_each_number_once_and_the_target() -> None:
    assert check("(3 + 5) * 2", [2, 3, 5], 16)
    assert not check("(3 + 5) * 2", [2, 3, 5], 15)  # wrong value
    assert not check("3 * 5 + 1", [2, 3, 5], 16)  # 1 is not given, 2 unused
    assert not check("(3 + 5) * 2 * 1", [2, 3, 5], 16)
    env = load_environment("countdown")
    for example in env.examples("train", 20):  # every generated problem has a solution
        assert example.info["target"] >= 0 and len(example.info["numbers"]) == 3
    example = env.examples("train", 1)[0]
    assert score(env, "<answer>not an expression</answer>", example) == 0.0


def test_math_reward_from_a_data_file(tmp_path: Path) -> None:
    data = tmp_path / "problems.jsonl"
    lines = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]
    data.write_text("\n".join(json.dumps(line) for line in lines))
    env = load_environment("math", {"data_path": str(data)})
    example = env.examples("train", 1)[0]
    assert score(env, rf"so \boxed{{{example.answer}}}", example) == 1.0
    assert score(env, rf"so \boxed{{ {example.answer}.0 }}", example) == 1.0  # normalised
    assert score(env, example.answer, example) == 0.0  # no box, no reward


def test_jsonl_source_reads_async_grpo_fields_and_names_bad_lines(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    rows = [{"input": f"say {i}", "answer": str(i)} for i in range(30)]
    rows += [{"input_token_ids": [70, 71, i], "answer": "x"} for i in range(30)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = load_environment("jsonl", {"path": str(data), "reward": "exact"})
    examples = env.examples("train", 60)
    assert any(e.prompt_token_ids for e in examples) and any(
        not e.prompt_token_ids for e in examples
    )
    plain = next(e for e in examples if not e.prompt_token_ids)
    assert score(env, f" {plain.answer} ", plain) == 1.0
    (tmp_path / "bad.jsonl").write_text('{"input": "a", "answer": "b"}\n{"answer": "c"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: needs `input` or `input_token_ids`"):
        load_environment("jsonl", {"path": str(tmp_path / "bad.jsonl")})
