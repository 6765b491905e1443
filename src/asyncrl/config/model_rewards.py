"""Reward terms that are models (`env[].model_rewards`): a sequence-classification reward model,
a generative judge behind an OpenAI-compatible endpoint, or a user's own scorer (a plugin).

Each term is a rubric term like a reward function: it has a name (its metric is
`orchestrator/reward/<name>`), a weight in the rollout's reward, and it runs where it cannot
block the orchestrator's loop (a process of its own, or a server). `envs/model_rewards/` runs
them; `docs/judges.md` is the user's page.
"""

from __future__ import annotations

import re
import string
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from asyncrl.config.base import StrictModel

# what the orchestrator's process is given by `asyncrl rl` (local): the GPUs its reward models'
# scorer processes see, as their CUDA_VISIBLE_DEVICES (the orchestrator itself sees none)
SCORER_DEVICES_ENV = "ASYNCRL_SCORER_DEVICES"

# the fields a judge's prompt template may use
PROMPT_FIELDS = ("task", "completion", "answer")

DEFAULT_JUDGE_PROMPT = (
    "Task:\n{task}\n\nResponse:\n{completion}\n\n"
    "How well does the response do the task? Answer with a score from 0 to 10, the number only."
)


class ModelTermBase(StrictModel):
    name: str = Field(
        description="The term's name in the rubric and in metrics (`orchestrator/reward/<name>`); "
        "unique among the environment's terms."
    )
    weight: float = Field(1.0, description="Weight of the term in the rollout's reward.")
    timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds one call may take (a judge: one HTTP attempt; a scorer process: one "
        "batch) before it counts as a `timeout`.",
    )


class RewardModelTermConfig(ModelTermBase):
    """A Hugging Face sequence-classification model scoring (prompt, completion) as one text."""

    type: Literal["reward_model"] = "reward_model"
    name: str = Field("reward_model", description=ModelTermBase.model_fields["name"].description)
    model: str = Field(description="Hugging Face id or local path of the reward model.")
    label: int | None = Field(
        None,
        ge=0,
        description="null: the model's single logit is the score (num_labels must be 1); k: the "
        "softmax probability of label k.",
    )
    batch_size: int = Field(16, gt=0, description="Texts per forward pass.")
    max_length: int = Field(
        1024, gt=0, description="Tokens per text at most; longer texts lose their beginning."
    )
    device: str = Field(
        "cpu",
        description="Torch device of the reward model's process: `cpu`, or `cuda` / `cuda:N` "
        "(N counts among the GPUs that process sees: under `asyncrl rl`, `gpu_ids.reward_model`, "
        "else the inference server's; not on Ray, whose orchestrator has no GPU).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights and activations dtype."
    )
    threads: int = Field(1, gt=0, description="CPU threads of the reward model's process.")
    trust_remote_code: bool = Field(False, description="Allow custom model code from the hub.")
    timeout: float = Field(
        120.0, gt=0, description=ModelTermBase.model_fields["timeout"].description
    )

    @field_validator("device")
    @classmethod
    def _cuda_device_is_well_formed(cls, device: str) -> str:
        if device.split(":")[0] == "cuda" and not re.fullmatch(r"cuda(:\d+)?", device):
            raise ValueError(f"{device!r}: a CUDA device is `cuda` or `cuda:N`")
        return device

    def on_cuda(self) -> bool:
        """Whether its process needs a GPU (`cuda`, `cuda:N`)."""
        return self.device.split(":")[0] == "cuda"


class JudgeTermConfig(ModelTermBase):
    """An LLM behind an OpenAI-compatible chat endpoint, asked to grade the completion."""

    type: Literal["judge"] = "judge"
    name: str = Field("judge", description=ModelTermBase.model_fields["name"].description)
    base_url: str | None = Field(
        None,
        description="The endpoint's base URL (`http://127.0.0.1:8001/v1`, a vLLM server, a "
        "hosted API). Leave it out under `asyncrl rl` with a `judge:` section: the run's own "
        "judge server is started and used.",
    )
    model: str | None = Field(
        None, description="Model name to request (null = the first the endpoint lists)."
    )
    api_key_var: str | None = Field(
        None,
        description="Environment variable holding the endpoint's API key (null, or unset = no "
        "key; the run's judge server: the run's key, the inference server's variable).",
    )
    system_prompt: str | None = Field(None, description="A system message before the prompt.")
    prompt: str = Field(
        DEFAULT_JUDGE_PROMPT,
        description="The judge's user message: a Python format string over `{task}` (the "
        "prompt's text), `{completion}` and `{answer}` (the example's reference answer); "
        "literal braces are doubled.",
    )
    read: Literal["number", "verdict"] = Field(
        "number",
        description="`number`: the first number in the answer (`number_pattern`), mapped from "
        "`scale` onto 0..1; `verdict`: the probability-weighted value of the verdict tokens "
        "(`verdicts`) at the answer's first token, from the endpoint's top logprobs.",
    )
    number_pattern: str = Field(
        r"-?\d+(?:\.\d+)?",
        description="(number) Regular expression of the score; its first group, if it has one.",
    )
    scale: tuple[float, float] = Field(
        (0.0, 10.0),
        description="(number) The judge's scale [low, high], mapped onto [0, 1]; a number "
        "outside it is unparseable.",
    )
    verdicts: dict[str, float] = Field(
        default_factory=lambda: {"Yes": 1.0, "No": 0.0},
        min_length=1,
        description="(verdict) Verdict token (as the endpoint spells it, surrounding spaces "
        "ignored) -> its value; the score is Σ p·value / Σ p over the verdicts found.",
    )
    top_logprobs: int = Field(
        20, ge=1, le=20, description="(verdict) Top logprobs asked for at each answer token."
    )
    max_tokens: int | None = Field(
        None,
        gt=0,
        description="Tokens the judge may answer with (null: 16 for number, 1 for verdict).",
    )
    temperature: float = Field(0.0, ge=0, description="Judge's sampling temperature.")
    max_concurrent: int = Field(8, gt=0, description="Requests in flight at once, at most.")
    startup_timeout: float = Field(
        600.0,
        gt=0,
        description="Seconds to wait at start-up for the endpoint to list its models (a judge "
        "server started with the run may still be loading).",
    )
    retries: int = Field(
        2, ge=0, description="Retries of a request that timed out or found no server (5xx, 429)."
    )
    backoff: float = Field(
        0.5, ge=0, description="Seconds before the first retry; doubled before each next one."
    )

    @field_validator("prompt")
    @classmethod
    def _known_fields(cls, prompt: str) -> str:
        try:
            fields = {
                name for _, name, _, _ in string.Formatter().parse(prompt) if name is not None
            }
        except ValueError as error:
            raise ValueError(
                f"`prompt` is not a format string ({error}); double literal braces"
            ) from None
        unknown = sorted(fields - set(PROMPT_FIELDS))
        if unknown:
            raise ValueError(
                f"`prompt` uses {unknown}; it may use {{task}}, {{completion}} and {{answer}}"
            )
        return prompt

    @field_validator("number_pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"`number_pattern` is not a regular expression: {error}") from None
        return pattern

    @model_validator(mode="after")
    def _scale_has_width(self) -> JudgeTermConfig:
        low, high = self.scale
        if not high > low:
            raise ValueError(f"`scale` must be [low, high] with high > low, got {list(self.scale)}")
        return self

    @model_validator(mode="after")
    def _endpoint_named(self) -> JudgeTermConfig:
        if self.base_url is None:
            raise ValueError(
                f"judge `{self.name}` has no `base_url`: give the endpoint's URL (…/v1), or run "
                "`asyncrl rl` with a `judge:` section, which starts the judge and fills it in"
            )
        return self

    def answer_tokens(self) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        return 16 if self.read == "number" else 1


class PluginTermConfig(ModelTermBase):
    """A user's own model-based scorer, run in a process of its own (as ms-swift's
    `reward_model_plugin`): `import_path` names a factory `(**args) -> scorer`, and
    `scorer(items: list[ScoreItem]) -> list[float | None]` scores a batch."""

    type: Literal["plugin"] = "plugin"
    name: str = Field("plugin", description=ModelTermBase.model_fields["name"].description)
    import_path: str = Field(
        description="`module:factory`; the factory is called once, in the scorer's process."
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for it.")
    threads: int = Field(1, gt=0, description="CPU threads of the scorer's process.")
    timeout: float = Field(
        120.0, gt=0, description=ModelTermBase.model_fields["timeout"].description
    )

    @field_validator("import_path")
    @classmethod
    def _module_and_name(cls, path: str) -> str:
        module, _, name = path.partition(":")
        if not module or not name:
            raise ValueError(f"`import_path` must be `module:factory`, got {path!r}")
        return path


ModelRewardConfig = Annotated[
    RewardModelTermConfig | JudgeTermConfig | PluginTermConfig, Field(discriminator="type")
]


def fill_in_run_judge(
    orchestrator: dict[str, Any], base_url: str, model: str, api_key_var: str
) -> dict[str, Any]:
    """The raw orchestrator config (before validation) with every judge term that has no
    `base_url` pointed at the run's judge server, training and evaluation environments alike
    (copies: the caller's dicts are left as they were)."""

    def point(entries: Any) -> Any:
        if not isinstance(entries, list):
            return entries
        pointed = []
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("model_rewards"), list):
                entry = {**entry, "model_rewards": [point_term(t) for t in entry["model_rewards"]]}
            pointed.append(entry)
        return pointed

    def point_term(term: Any) -> Any:
        if not (
            isinstance(term, dict) and term.get("type") == "judge" and not term.get("base_url")
        ):
            return term
        return {"model": model, "api_key_var": api_key_var, **term, "base_url": base_url}

    pointed = dict(orchestrator)
    if "env" in pointed:
        pointed["env"] = point(pointed["env"])
    evaluation = pointed.get("eval")
    if isinstance(evaluation, dict) and "env" in evaluation:
        pointed["eval"] = {**evaluation, "env": point(evaluation["env"])}
    return pointed
