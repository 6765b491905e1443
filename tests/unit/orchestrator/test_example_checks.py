"""One bad example costs that example, never the run: what can be judged at start-up is refused
there with the example's source; what only a server can judge is skipped, counted and logged
once; a server that refuses everything still stops the run, by name."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs.base import Example
from asyncrl.envs.remote import RemoteEnvironment
from asyncrl.orchestrator.example_checks import Rejections, check_prompt_ids
from asyncrl.orchestrator.generation import RequestRejected
from asyncrl.orchestrator.orchestrator import Orchestrator


def token_example(ids: object, source: str | None = "d.jsonl:7") -> Example:
    return Example(0, [], "", "t", prompt_token_ids=ids, source=source)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([999_999_999], r"d\.jsonl:2: `input_token_ids\[0\]` is 999999999, outside the "
                        r"tokenizer's vocabulary of \d+"),
        ([5] * 60, r"d\.jsonl:2: the prompt's 60 tokens and max_tokens 8 exceed seq_len 64"),
    ],
)  # fmt: skip
def test_a_prompt_the_model_cannot_take_fails_start_up_naming_its_line(
    tiny_model_dir: Path, tmp_path: Path, ids: list[int], message: str
) -> None:
    """It passed start-up and stopped `asyncrl rl` (rc 1, no step) each time it was drawn."""
    data = tmp_path / "d.jsonl"
    lines = [{"input": "abc", "answer": "x"}, {"input_token_ids": ids, "answer": "x"}]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = OrchestratorConfig(
        model={"name": str(tiny_model_dir)}, seq_len=64, sampling={"max_tokens": 8},
        env=[{"id": "jsonl", "args": {"path": str(data), "eval_path": str(data)}}],
        batch_size=2, rollouts_per_example=2, output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        Orchestrator(config)


def test_examples_from_an_env_server_are_checked_and_named_by_server_and_place() -> None:
    env = RemoteEnvironment("http://env:9000", {}, {"name": "e", "rubric": []})
    fields = {"example_id": 3, "prompt": [], "answer": "", "task": "t",
              "prompt_token_ids": "1 2 3"}  # fmt: skip
    example = env._example(4, fields)
    with pytest.raises(ConfigError, match=r"env-server http://env:9000 example 4: "
                       "`input_token_ids` is a string"):  # fmt: skip
        check_prompt_ids([("e", [example])], vocab_size=100, seq_len=64, max_tokens=8)
    with pytest.raises(ConfigError, match=r"env-server http://env:9000 example 0: not an example"):
        env._example(0, {"prompt": []})


def refusal(status: int = 400) -> RequestRejected:
    return RequestRejected("http://s/v1/completions", status, "prompt has 100 tokens")


def test_a_refused_example_is_skipped_counted_and_logged_once_per_source(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rejections = Rejections(give_up_after=16)
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        for _ in range(3):
            rejections.skip(token_example([1]), "jsonl", refusal())
            rejections.served()  # a group between them: no streak
        rejections.skip(token_example([1], source="d.jsonl:9"), "jsonl", refusal(413))
    logged = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    assert len(logged) == 2 and "d.jsonl:7 is skipped" in logged[0] and "100 tokens" in logged[0]
    assert rejections.metrics() == {"orchestrator/rejected_examples": 4.0}
    assert rejections.metrics() == {"orchestrator/rejected_examples": 0.0}  # per step


def test_a_refusal_that_is_not_about_the_example_stops_the_run() -> None:
    """A wrong key or an unknown model would be refused for every example alike."""
    with pytest.raises(RuntimeError, match=r"refused a request for d\.jsonl:7, not for its "
                       r"content .*401"):  # fmt: skip
        Rejections(16).skip(token_example([1]), "jsonl", refusal(401))


def test_refusals_in_a_row_with_no_group_between_stop_the_run_naming_the_last() -> None:
    rejections = Rejections(give_up_after=3)
    rejections.skip(token_example([1]), "jsonl", refusal())
    rejections.skip(token_example([1]), "jsonl", refusal())
    with pytest.raises(RuntimeError, match=r"3 examples in a row were refused .* d\.jsonl:7"):
        rejections.skip(token_example([1]), "jsonl", refusal())
