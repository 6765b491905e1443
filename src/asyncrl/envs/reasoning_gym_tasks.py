"""`reasoning-gym/<dataset>`: any reasoning-gym dataset as a single-turn environment.

reasoning-gym (an optional extra: `pip install 'asyncrl[reasoning-gym]'`) generates verifiable
problems procedurally: item `index` of a dataset built with `seed` is always the same problem,
and the dataset's own `score_answer(answer, entry)` judges an answer. This adapter gives:

- the prompt: the item's question as the user message, after an optional system prompt (one of
  reasoning-gym's named prompts, or text of your own);
- the splits: items are walked in index order from the dataset's seed, and each goes to `train`
  or `eval` by a hash of its question (`split_of`), so the held-out split never shares a prompt
  with training, whatever the seed;
- the reward: the dataset's own `score_answer` on the answer extracted from the completion
  (`answer_format: tag` reads the last `<answer>…</answer>`, `plain` the whole completion); an
  answer the scorer chokes on scores 0;
- with `stop_at_answer: true` (`tag` only), the completion ends at its first `</answer>`, kept in
  the text (a stop string with vLLM's `include_stop_str_in_output`): what a model writes after
  its answer is never read by the scorer, and left to run it is generated, trained on and
  reinforced with the answer until `max_tokens` cuts it;
- the demonstration for `asyncrl sft`: the item's own answer, formatted as the reward reads it.

A composite (`reasoning-gym/composite`, `datasets: [{name, weight, config}]`) draws each item's
dataset by weight (reasoning-gym's own composite) and has one rubric term per dataset, each
scoring only its own items, so every dataset's reward is logged on its own. (Separate
`reasoning-gym/<name>` entries with `orchestrator.buffer.env_ratios` are the other way to mix.)

The worker that scores a completion rebuilds the item from (dataset, index) rather than reading
it from the example, so metadata that is not JSON (sets, fractions, grids) never crosses a
process boundary.
"""

from __future__ import annotations

import importlib
import re
from functools import lru_cache
from typing import Any, Literal

from asyncrl.envs.base import Example, Messages, RewardFunction, Split, split_of
from asyncrl.envs.plain_prompt import PLAIN_STOP, PromptFormat, plain_prompt

PREFIX = "reasoning-gym/"
DEFAULT_SIZE = 10_000  # items a dataset is built with unless `size` is given (some precompute)
AnswerFormat = Literal["tag", "plain"]
ANSWER_END = "</answer>"
NUMBER = re.compile(r"[+-]?\d[\d,]*(\.\d+)?")  # what reasoning-gym's numeric scorers read


class ReasoningGymError(ValueError):
    """The dataset, its arguments or its items cannot make an environment; says which."""


def _reasoning_gym() -> Any:
    """The package, with the submodules used here imported."""
    try:
        gym = importlib.import_module("reasoning_gym")
        for submodule in ("composite", "factory", "utils"):
            importlib.import_module(f"reasoning_gym.{submodule}")
        return gym
    except ModuleNotFoundError as error:
        raise ReasoningGymError(
            "reasoning-gym environments need the `reasoning-gym` package: "
            "pip install 'asyncrl[reasoning-gym]' (reasoning-gym==0.1.25)"
        ) from error


class ReasoningGymEnv:
    def __init__(
        self,
        dataset: str,
        seed: int = 0,
        size: int = DEFAULT_SIZE,
        system_prompt: str | None = "default",
        answer_format: AnswerFormat = "tag",
        prompt_format: PromptFormat = "chat",
        stop_at_answer: bool = False,
        **config: Any,
    ) -> None:
        """`config` is the dataset's own configuration (its dataclass's fields, e.g.
        `min_word_len` for spell_backward; `datasets` for the composite). `system_prompt` is
        a name from reasoning-gym's `SYSTEM_PROMPTS`, text of your own, or null for none."""
        gym = _reasoning_gym()
        registry = gym.factory.DATASETS
        if dataset not in registry:
            raise ReasoningGymError(
                f"reasoning-gym has no dataset `{dataset}`; it has: {', '.join(sorted(registry))}"
            )
        if answer_format not in ("tag", "plain"):
            raise ReasoningGymError(f"answer_format is `tag` or `plain`, not {answer_format!r}")
        if prompt_format not in ("chat", "plain"):
            raise ReasoningGymError(f"prompt_format is `chat` or `plain`, not {prompt_format!r}")
        self.prompt_format = prompt_format
        if stop_at_answer and (answer_format != "tag" or prompt_format != "chat"):
            raise ReasoningGymError(
                "stop_at_answer needs answer_format `tag` and prompt_format `chat` (a plain "
                "answer already ends at its line)"
            )
        self.stop_at_answer = stop_at_answer
        if size < 1:
            raise ReasoningGymError(f"size must be >= 1, got {size}")
        config_class = registry[dataset][1]
        known = set(config_class.__dataclass_fields__) - {"seed", "size"}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ReasoningGymError(
                f"unknown argument(s) {unknown}; the dataset takes "
                f"{sorted(known)}, and the adapter seed, size, system_prompt, answer_format, "
                "prompt_format, stop_at_answer"
            )
        if dataset == "composite":
            config = {**config, "datasets": composite_specs(gym, config.get("datasets"))}
        try:
            self.dataset = gym.create_dataset(dataset, seed=seed, size=size, **config)
        except (AssertionError, TypeError, ValueError) as error:
            raise ReasoningGymError(f"bad arguments: {error}") from error
        self.name = PREFIX + dataset
        self.dataset_name = dataset
        self.seed = seed
        self.size = size
        self.answer_format = answer_format
        self.system_prompt = gym.utils.SYSTEM_PROMPTS.get(system_prompt, system_prompt)
        parts = list(self.dataset.dataset_names) if dataset == "composite" else [dataset]
        self.rubric = [RewardFunction(part, self._scorer(part)) for part in parts]

    # examples -------------------------------------------------------------------------------
    def examples(self, split: Split, count: int) -> list[Example]:
        """The first `count` items of `split`, in index order (deterministic per seed)."""
        examples: list[Example] = []
        for index in range(self.size):
            if len(examples) == count:
                return examples
            entry = self.entry(index)
            if split_of(entry["question"]) != split:
                continue
            examples.append(self._example(index, entry))
        if len(examples) < count:
            raise ReasoningGymError(
                f"{self.name}: its {self.size} items hold {len(examples)} {split} prompts, "
                f"{count} were asked for; raise `size`"
            )
        return examples

    def entry(self, index: int) -> dict[str, Any]:
        """The dataset's item `index` (question, answer, metadata), rebuilt on demand."""
        return _entry(self.dataset, index)

    def _example(self, index: int, entry: dict[str, Any]) -> Example:
        prompt: Messages = [{"role": "user", "content": entry["question"]}]
        if self.system_prompt:
            prompt.insert(0, {"role": "system", "content": self.system_prompt})
        source = entry.get("metadata", {}).get("source_dataset", self.dataset_name)
        return Example(
            example_id=index,
            prompt=prompt,
            answer=str(entry["answer"]),
            task=str(source),
            info={"index": index},
            # a base model's form (`plain_prompt.py`): `Question: …\nAnswer:`, one line back
            prompt_text=plain_prompt(prompt) if self.prompt_format == "plain" else None,
            stop=self._stop(),
            stop_kept=self.stop_at_answer,
        )

    def _stop(self) -> tuple[str, ...]:
        if self.prompt_format == "plain":
            return PLAIN_STOP
        return (ANSWER_END,) if self.stop_at_answer else ()

    # reward and demonstration -----------------------------------------------------------------
    def answer_in(self, completion: str) -> str | None:
        """What the dataset's scorer is given: the last `<answer>` block, or the whole text."""
        if self.answer_format == "plain":
            return completion.strip()
        return _reasoning_gym().utils.extract_answer(completion)

    def _scorer(self, part: str) -> Any:
        def scored(completion: str, example: Example) -> float:
            if example.task != part:  # a composite's item of another dataset
                return 0.0
            entry = self.entry(int(example.info["index"]))
            try:
                return float(self.dataset.score_answer(self.answer_in(completion), entry))
            except Exception:  # a scorer that chokes on a malformed answer: a wrong answer
                return 0.0

        return scored

    def formatted(self, completion: str, example: Example) -> bool:
        """Whether the completion gives an answer in the asked form, right or wrong: an
        `<answer>` block (`tag`), or (`plain`) nothing but an answer shaped like the item's own
        (a number for a numeric answer, else as many words). What `asyncrl eval` reports as
        `format`, apart from the reward, so that a gain in form is told from one in skill."""
        answer = self.answer_in(completion)
        if answer is None:
            return False
        if self.answer_format == "tag":
            return True
        if NUMBER.fullmatch(example.answer.strip()):
            return NUMBER.fullmatch(answer) is not None
        return bool(answer) and len(answer.split()) <= len(example.answer.split())

    def demonstration(self, example: Example) -> Messages:
        """The item's own answer as the model should write it (the supervised warm-up)."""
        answer = example.answer
        text = answer if self.answer_format == "plain" else f"<answer>{answer}</answer>"
        return [*example.prompt, {"role": "assistant", "content": text}]


@lru_cache(maxsize=4096)
def _entry(dataset: Any, index: int) -> dict[str, Any]:
    return dataset[index]  # type: ignore[no-any-return]


def composite_specs(gym: Any, datasets: Any) -> list[Any]:
    """`[{name, weight, config}]` as reasoning-gym's `DatasetSpec`s, checked."""
    if not isinstance(datasets, list) or not datasets:
        raise ReasoningGymError(
            "reasoning-gym/composite needs `datasets`: a list of {name, weight, config}"
        )
    specs = []
    for position, spec in enumerate(datasets):
        if not isinstance(spec, dict) or "name" not in spec:
            raise ReasoningGymError(f"datasets[{position}]: need {{name, weight, config}}")
        extra = sorted(set(spec) - {"name", "weight", "config"})
        if extra:
            raise ReasoningGymError(f"datasets[{position}]: unknown key(s) {extra}")
        weight = float(spec.get("weight", 1.0))
        if weight <= 0:
            raise ReasoningGymError(f"datasets[{position}] ({spec['name']}): weight must be > 0")
        name = spec["name"]
        if name not in gym.factory.DATASETS or name == "composite":
            raise ReasoningGymError(f"datasets[{position}]: reasoning-gym has no dataset `{name}`")
        specs.append(gym.composite.DatasetSpec(name, weight, dict(spec.get("config") or {})))
    return specs


def load_reasoning_gym(dataset: str, **args: Any) -> ReasoningGymEnv:
    """The environment for id `reasoning-gym/<dataset>`."""
    return ReasoningGymEnv(dataset, **args)
