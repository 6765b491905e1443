"""A Hugging Face sequence-classification reward model, scoring batches of rollouts.

Each rollout becomes one text: the prompt's messages and the completion as one conversation,
rendered with the reward model's own chat template (as TRL does for conversational data), or
`task\\ncompletion` for a tokenizer without one. Texts are scored `batch_size` at a time, padded
on the right with an attention mask, so a text's score does not depend on its batch; a text
longer than `max_length` tokens loses its beginning (the completion, at the end, is what is
judged). The score is the model's single logit, or with `label: k` the softmax probability of
label k. Loaded in the scorer's own process (`scorer_worker`), never in the orchestrator's.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from asyncrl.config.model_rewards import RewardModelTermConfig
from asyncrl.envs.model_rewards.items import ScoreItem

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def reward_model_text(tokenizer: Any, item: ScoreItem) -> str:
    """The text the reward model reads for one rollout."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(item.conversation(), tokenize=False)
        return str(text)
    return f"{item.task_text}\n{item.completion_text}"


class SequenceClassifierScorer:
    """`scorer(items) -> scores` over a sequence-classification model; `tokens` counts the
    tokens read so far (a figure for the metrics)."""

    def __init__(self, config: RewardModelTermConfig) -> None:
        self.config = config
        torch.set_num_threads(config.threads)
        self.device = torch.device(config.device)
        self.tokenizer = AutoTokenizer.from_pretrained(
            config.model, trust_remote_code=config.trust_remote_code
        )
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:  # many decoder tokenizers have none: reuse EOS
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            config.model, dtype=DTYPES[config.dtype], trust_remote_code=config.trust_remote_code
        ).to(self.device)
        self.model.eval()
        if self.model.config.pad_token_id is None:  # the head finds each text's last token by it
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        labels = int(self.model.config.num_labels)
        if config.label is None and labels != 1:
            raise ValueError(
                f"reward model {config.model} has {labels} labels: set `label` to the one whose "
                "probability is the score"
            )
        if config.label is not None and config.label >= labels:
            raise ValueError(f"`label` {config.label} is not below num_labels ({labels})")
        self.tokens = 0

    @torch.inference_mode()
    def __call__(self, items: list[ScoreItem]) -> list[float]:
        texts = [reward_model_text(self.tokenizer, item) for item in items]
        scores: list[float] = []
        for start in range(0, len(texts), self.config.batch_size):
            scores += self.score_texts(texts[start : start + self.config.batch_size])
        return scores

    def score_texts(self, texts: list[str]) -> list[float]:
        encoded = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.config.max_length,
            add_special_tokens=False, return_tensors="pt",
        ).to(self.device)  # fmt: skip
        self.tokens += int(encoded["attention_mask"].sum())
        logits = self.model(**encoded).logits.float()  # [batch, num_labels]
        if self.config.label is None:
            return logits[:, 0].tolist()
        return torch.softmax(logits, dim=-1)[:, self.config.label].tolist()
