"""reasoning-gym datasets as environments: each dataset's own answer scores 1.0 through the
adapter (as the demonstration writes it and the rubric reads it), a wrong one less, and the
held-out split never shares a prompt with training."""

from __future__ import annotations

import re

import pytest

from asyncrl.envs import load_environment
from asyncrl.envs.base import score
from asyncrl.envs.registry import EnvironmentLoadError

pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed")

DATASETS = {
    "spell_backward": {"min_word_len": 3, "max_word_len": 6},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 3, "max_digits": 2},
    "letter_counting": {},
    "word_sorting": {},
    "chain_sum": {},
    "caesar_cipher": {},
    "prime_factorization": {},  # its scorer raises on a non-number: the adapter scores 0
}
WRONG = ["", "no idea", "<answer>0</answer>", "<answer>zzzz</answer>"]


def prompt_text(example) -> str:
    return "\n".join(message["content"] for message in example.prompt)


@pytest.mark.parametrize("answer_format", ["tag", "plain"])
@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_the_datasets_own_answer_scores_one_and_a_wrong_one_less(
    dataset: str, answer_format: str
) -> None:
    args = {**DATASETS[dataset], "seed": 5, "answer_format": answer_format}
    env = load_environment(f"reasoning-gym/{dataset}", args)
    for example in env.examples("train", 12) + env.examples("eval", 4):
        demonstrated = env.demonstration(example)
        assert demonstrated[:-1] == example.prompt
        completion = demonstrated[-1]["content"]
        assert score(env, completion, example) == 1.0, (example, completion)
        if answer_format == "tag":  # reasoning before the answer is allowed
            assert score(env, f"<think>hm</think>\n{completion}", example) == 1.0
        assert all(score(env, wrong, example) < 1.0 for wrong in WRONG if wrong != completion)


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_held_out_prompts_never_appear_in_training(dataset: str) -> None:
    env = load_environment(f"reasoning-gym/{dataset}", {**DATASETS[dataset], "seed": 1})
    train = {prompt_text(example) for example in env.examples("train", 400)}
    held_out = {prompt_text(example) for example in env.examples("eval", 50)}
    assert len(held_out) > 1
    assert not train & held_out


def test_the_same_seed_gives_the_same_examples_and_another_seed_others() -> None:
    def prompts(seed: int) -> list[str]:
        env = load_environment("reasoning-gym/basic_arithmetic", {"seed": seed})
        return [prompt_text(example) for example in env.examples("train", 20)]

    assert prompts(3) == prompts(3)
    assert prompts(3) != prompts(4)


def test_system_prompt_by_name_text_or_none() -> None:
    from reasoning_gym.utils import SYSTEM_PROMPTS

    def first_prompt(system_prompt):
        env = load_environment("reasoning-gym/chain_sum", {"system_prompt": system_prompt})
        return env.examples("train", 1)[0].prompt

    assert first_prompt("direct")[0] == {"role": "system", "content": SYSTEM_PROMPTS["direct"]}
    assert first_prompt("Add them.")[0] == {"role": "system", "content": "Add them."}
    assert [m["role"] for m in first_prompt(None)] == ["user"]


def test_a_composite_mixes_its_datasets_by_weight_with_one_rubric_term_each() -> None:
    datasets = [
        {"name": "spell_backward", "weight": 3, "config": {"max_word_len": 5}},
        {"name": "chain_sum", "weight": 1},
    ]
    env = load_environment("reasoning-gym/composite", {"datasets": datasets, "seed": 2})
    assert [term.name for term in env.rubric] == ["spell_backward", "chain_sum"]
    examples = env.examples("train", 400)
    share = sum(example.task == "spell_backward" for example in examples) / len(examples)
    assert 0.65 < share < 0.85  # 3 : 1
    for example in examples[:20]:
        completion = env.demonstration(example)[-1]["content"]
        values = {term.name: term.function(completion, example) for term in env.rubric}
        # the item's own dataset scores it; the other term stays 0
        assert values == {name: float(name == example.task) for name in values}
    held_out = {prompt_text(example) for example in env.examples("eval", 40)}
    assert not {prompt_text(example) for example in examples} & held_out


@pytest.mark.parametrize(
    ("env_id", "args", "says"),
    [
        ("reasoning-gym/no_such_task", {}, "has no dataset `no_such_task`"),
        ("reasoning-gym/spell_backward", {"min_len": 3}, "unknown argument(s) ['min_len']"),
        ("reasoning-gym/spell_backward", {"min_word_len": 0}, "bad arguments"),
        ("reasoning-gym/spell_backward", {"answer_format": "json"}, "answer_format"),
        ("reasoning-gym/composite", {}, "needs `datasets`"),
        ("reasoning-gym/composite", {"datasets": [{"name": "nope"}]}, "no dataset `nope`"),
    ],
)
def test_bad_arguments_fail_at_load_naming_what_was_wrong(env_id: str, args: dict, says: str):
    with pytest.raises(EnvironmentLoadError, match=rf"`{env_id}`.*{re.escape(says)}"):
        load_environment(env_id, args)


def test_asking_for_more_prompts_than_the_items_hold_says_raise_size() -> None:
    env = load_environment("reasoning-gym/chain_sum", {"size": 16})
    with pytest.raises(ValueError, match="raise `size`"):
        env.examples("eval", 10)


@pytest.mark.parametrize(
    ("answer_format", "completion", "formatted"),
    [
        ("tag", "3 + 4 = 7\n<answer>7</answer>", True),
        ("tag", "<answer>12</answer>", True),  # wrong, but in the asked form
        ("tag", "3 + 4 = 7", False),  # right, but not in the form the reward reads
        ("plain", "7", True),
        ("plain", " -12 ", True),
        ("plain", "3 + 4 = 7", False),
        ("plain", "The answer is 7.", False),
    ],
)
def test_format_is_the_answers_form_whatever_its_value(
    answer_format: str, completion: str, formatted: bool
) -> None:
    env = load_environment(
        "reasoning-gym/chain_sum", {"max_terms": 2, "max_digits": 1, "answer_format": answer_format}
    )
    example = env.examples("eval", 1)[0]
    assert env.formatted(completion, example) is formatted


def test_a_word_answer_is_formatted_when_it_has_no_more_words_than_the_item_s() -> None:
    env = load_environment("reasoning-gym/spell_backward", {"answer_format": "plain"})
    example = env.examples("eval", 1)[0]
    assert env.formatted(example.answer, example)
    assert not env.formatted(f"It is {example.answer} backwards", example)


def test_stop_at_answer_ends_a_completion_at_its_closing_tag_and_keeps_it() -> None:
    """What the server is asked (the stop, kept in the text) and how a completion it stopped
    scores: a right answer with prose after it is cut to the answer and still scores 1."""
    from asyncrl.config.orchestrator import OrchestratorConfig
    from asyncrl.envs.plain_prompt import cut_at_stop
    from asyncrl.orchestrator.buffer import Drawn
    from asyncrl.orchestrator.group import GroupRequest, request_body

    args = {"max_terms": 2, "max_digits": 1, "stop_at_answer": True}
    env = load_environment("reasoning-gym/chain_sum", args)
    example = env.examples("train", 1)[0]
    assert (example.stop, example.stop_kept) == (("</answer>",), True)
    answered = f"1 + 2 = 3\n<answer>{example.answer}</answer>"
    written = f"{answered}\n\nIn this sum <answer>{example.answer}1</answer>"  # a wrong last one
    assert cut_at_stop(written, example.stop, kept=example.stop_kept) == answered
    stopped = answered
    assert score(env, stopped, example) == 1.0 and score(env, written, example) < 1.0
    config = OrchestratorConfig(model={"name": "m"}, env=[{"id": "reverse-text"}])
    _, body = request_body(GroupRequest(Drawn(0, example), "e", "m", 1.0, None, 0), config)
    assert body["stop"] == ["</answer>"] and body["include_stop_str_in_output"] is True
    plain = load_environment("reasoning-gym/chain_sum", {"max_terms": 2, "max_digits": 1})
    assert plain.examples("train", 1)[0].stop == ()  # off unless asked


@pytest.mark.parametrize("args", [{"answer_format": "plain"}, {"prompt_format": "plain"}])
def test_stop_at_answer_without_an_answer_tag_is_refused(args: dict) -> None:
    with pytest.raises(EnvironmentLoadError, match="stop_at_answer needs answer_format"):
        load_environment("reasoning-gym/chain_sum", {**args, "stop_at_answer": True})
