"""A base model's prompt: `Question: …\\nAnswer:` as text to the completions route, ended at the
first newline, the same in `asyncrl rl` (the server stops) and `asyncrl eval` (cut there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs.base import Example
from asyncrl.envs.plain_prompt import PlainPromptError, cut_at_stop, plain_prompt
from asyncrl.evaluate import generate_completions
from asyncrl.orchestrator.buffer import Drawn
from asyncrl.orchestrator.group import GroupRequest, request_body

pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed")
from asyncrl.envs.reasoning_gym_tasks import ReasoningGymEnv

CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "max_digits": 1, "system_prompt": None, "size": 200,
             "answer_format": "plain"}  # fmt: skip


def test_a_plain_prompt_is_a_question_and_an_answer_cue_under_the_system_text() -> None:
    assert plain_prompt([{"role": "user", "content": "What is 3 + 4?"}]) == (
        "Question: What is 3 + 4?\nAnswer:"
    )
    with_system = [{"role": "system", "content": "Answer with the number."},
                   {"role": "user", "content": "What is 3 + 4?\n"}]  # fmt: skip
    assert (
        plain_prompt(with_system) == "Answer with the number.\n\nQuestion: What is 3 + 4?\nAnswer:"
    )
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": "c"}]  # fmt: skip
    with pytest.raises(PlainPromptError, match="one user message"):
        plain_prompt(turns)


def test_plain_examples_go_to_the_completions_route_as_text_and_stop_at_a_newline() -> None:
    config = OrchestratorConfig(model={"name": "m"}, env=[{"id": "reverse-text"}],
                                sampling={"max_tokens": 16})  # fmt: skip
    plain = ReasoningGymEnv("chain_sum", prompt_format="plain", **CHAIN_SUM).examples("train", 1)[0]
    assert plain.prompt_text is not None and plain.prompt_text.endswith(" =\nAnswer:")
    assert plain.prompt_text.startswith("Question: ")
    route, body = request_body(GroupRequest(Drawn(0, plain), "e", "m", 1.0, None, 0), config)
    assert (route, body["prompt"], body["stop"]) == ("completions", plain.prompt_text, ["\n"])
    assert "messages" not in body
    chat = ReasoningGymEnv("chain_sum", **CHAIN_SUM).examples("train", 1)[0]
    route, body = request_body(GroupRequest(Drawn(0, chat), "e", "m", 1.0, None, 0), config)
    assert route == "chat/completions" and "stop" not in body and chat.prompt_text is None


def tiny_model_and_plain_examples(model_dir: Path) -> tuple[Any, Any, list[Example]]:
    """The tiny model, its tokenizer and 8 held-out chain_sum prompts in the plain form."""
    env = ReasoningGymEnv("chain_sum", prompt_format="plain", **CHAIN_SUM)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(model_dir), env.examples("eval", 8)


def test_eval_cuts_a_plain_completion_where_the_server_stops(tiny_model_dir: Path) -> None:
    assert cut_at_stop(" 7\nQuestion: What", ("\n",)) == " 7"
    assert cut_at_stop(" 7", ("\n",)) == " 7"
    model, tokenizer, examples = tiny_model_and_plain_examples(tiny_model_dir)
    texts = generate_completions(model, tokenizer, examples, max_tokens=24, temperature=1.0,
                                 batch_size=8, seed=0)  # fmt: skip
    assert len(texts) == 8 and not any("\n" in text for text in texts)


def test_eval_stopping_early_at_the_newline_changes_no_completion(tiny_model_dir: Path) -> None:
    """`generate` told the stop string ends a batch once every row wrote it; each completion must
    still be the one a full-length generation cut at the stop gives (same seed)."""
    model, tokenizer, examples = tiny_model_and_plain_examples(tiny_model_dir)
    stopped = generate_completions(model, tokenizer, examples, max_tokens=48, temperature=1.5,
                                   batch_size=8, seed=3)  # fmt: skip
    torch.manual_seed(3)
    tokenizer.padding_side = "left"
    encoded = tokenizer([e.prompt_text for e in examples], return_tensors="pt", padding=True)
    full = model.generate(**encoded, max_new_tokens=48, do_sample=True, temperature=1.5, top_k=0,
                          top_p=1.0, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    texts = tokenizer.batch_decode(full[:, encoded["input_ids"].shape[1] :],
                                   skip_special_tokens=True)  # fmt: skip
    assert sum("\n" in text for text in texts) >= 2  # the stop is met, so the test can fail
    assert stopped == [cut_at_stop(text, ("\n",)) for text in texts]
