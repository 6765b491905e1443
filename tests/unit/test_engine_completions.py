"""`asyncrl eval --generator engine`: the embedded engine's completions, checked against
`model.generate` (greedy: the same tokens) and for rows that do not depend on each other."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.base import ConfigError
from asyncrl.config.eval import EvalRunConfig
from asyncrl.engine_completions import engine_completions, grouped
from asyncrl.envs import Example
from asyncrl.envs.registry import load_environment
from asyncrl.evaluate import evaluate, generate_completions, run_eval


def tiny(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def test_greedy_completions_are_those_of_generate(tiny_model_dir: Path) -> None:
    model, tokenizer = tiny(tiny_model_dir)
    examples = load_environment("reverse-text", {}).examples("eval", 12)
    common = {"max_tokens": 12, "temperature": 0.0, "seed": 0}
    engine = engine_completions(model, tokenizer, examples, **common)
    reference = generate_completions(model, tokenizer, examples, batch_size=5, **common)
    assert engine == reference
    assert len(set(engine)) > 1  # the prompts matter


def test_plain_prompts_are_cut_at_their_stop_as_generate_cuts_them(tiny_model_dir: Path) -> None:
    model, tokenizer = tiny(tiny_model_dir)
    common = {"max_tokens": 16, "temperature": 0.0, "seed": 0}
    free = [Example(i, [], "", "t", prompt_text=f"abc{i} ") for i in range(4)]
    uncut = engine_completions(model, tokenizer, free, **common)
    # stop at a character each completion writes, after its start: the cut must matter
    stops = [next(c for c in text[1:] if c.strip()) for text in uncut]
    stopped = [
        Example(i, [], "", "t", prompt_text=f"abc{i} ", stop=(stop,))
        for i, stop in enumerate(stops)
    ]
    engine = engine_completions(model, tokenizer, stopped, **common)
    reference = [
        generate_completions(model, tokenizer, [example], batch_size=1, **common)[0]
        for example in stopped
    ]
    assert engine == reference
    assert all(len(cut) < len(whole) for cut, whole in zip(engine, uncut, strict=True))


def test_a_sampled_row_does_not_depend_on_the_rows_beside_it(tiny_model_dir: Path) -> None:
    """Row j draws from `seed + j` alone: an example's samples are the same whether the eval
    ran it beside others or alone (with its rows' seeds), and no two rows share a stream."""
    model, tokenizer = tiny(tiny_model_dir)
    first, second = load_environment("reverse-text", {}).examples("eval", 2)
    common = {"max_tokens": 10, "temperature": 1.0}
    together = engine_completions(model, tokenizer, [first] * 3 + [second] * 3, seed=7, **common)
    alone = engine_completions(model, tokenizer, [second] * 3, seed=10, **common)
    assert together[3:] == alone
    assert len(set(together[:3])) > 1  # each sample of a group its own draw
    again = engine_completions(model, tokenizer, [first] * 3 + [second] * 3, seed=7, **common)
    assert again == together


def test_runs_group_only_the_same_example_in_a_row() -> None:
    a, b = (Example(i, [], "", "t") for i in range(2))
    assert grouped([a, a, b, a]) == [(a, 2), (b, 1), (a, 1)]


def test_the_engine_scores_a_model_as_generate_does_greedily(tiny_model_dir: Path) -> None:
    model, tokenizer = tiny(tiny_model_dir)
    env = load_environment("reverse-text", {})
    common = {"num_examples": 8, "rollouts_per_example": 2, "max_tokens": 10}
    engine = evaluate(model, tokenizer, env, generator="engine", **common)
    reference = evaluate(model, tokenizer, env, **common)
    assert engine.rewards == reference.rewards
    assert engine.completions == reference.completions


def test_a_multi_turn_environment_asks_for_generate(tiny_model_dir: Path) -> None:
    config = EvalRunConfig(
        model=str(tiny_model_dir), generator="engine", env={"id": "guess-number"}
    )
    with pytest.raises(ConfigError, match="generator: hf"):
        run_eval(config)


def test_asyncrl_eval_lays_its_own_model_out_as_the_server_does_and_scores_the_same(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model `asyncrl eval` loads is its own: with `generator: engine` its float32 linears
    are read straight, as the server's are (`inference/input_major.py`), and the greedy
    completions are still those of `generate` on the model as loaded."""
    import asyncrl.evaluate as evaluate_module
    from asyncrl.inference.input_major import is_input_major

    seen: dict[str, bool] = {}

    def watched(model, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen[kwargs["generator"]] = is_input_major(model.model.layers[0].mlp.gate_proj.weight)
        return evaluate(model, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", watched)
    common = {"model": str(tiny_model_dir), "env": {"id": "reverse-text"}, "num_examples": 6,
              "max_tokens": 10, "temperature": 0.0}  # fmt: skip
    engine = run_eval(EvalRunConfig(generator="engine", **common))
    reference = run_eval(EvalRunConfig(generator="hf", **common))
    assert seen == {"engine": True, "hf": False}
    assert engine[0].result.completions == reference[0].result.completions
    assert engine[0].result.rewards == reference[0].result.rewards
