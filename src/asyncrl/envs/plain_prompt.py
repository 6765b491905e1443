"""A prompt for a base model: plain text, no chat template, and where the completion ends.

A pretrained base model (Gemma 3 270M, the starting point of R1-Zero-style RL) has no chat
template and no end-of-turn token it was taught to write: given `Question: …\\nAnswer:` it
answers, then goes on with the next `Question:` of an imagined exam. So the prompt is text in a
format the pretraining data is full of, sent to the completions route (the server tokenizes it
with the tokenizer's own special tokens, Gemma's `<bos>` included), and the completion ends at
the first newline (a stop string): one line of answer, the line break that ends it sampled and
trained as the model's own token, so the end is what the model learns to write.

```
{system prompt, when the environment has one}

Question: {the user message}
Answer:
```

The answer is what follows `Answer:` up to the newline; reward functions read it as they read a
chat completion (the text, without the stop string). One question and one answer: a multi-turn
environment has no plain form here.
"""

from __future__ import annotations

from typing import Literal

from asyncrl.envs.base import Messages

PromptFormat = Literal["chat", "plain"]
PLAIN_STOP = ("\n",)  # where a plain answer ends (the server stops there; eval cuts there)


class PlainPromptError(ValueError):
    """The messages have no plain-text form; the message says why."""


def plain_prompt(messages: Messages) -> str:
    """`messages` (an optional system message, then one user message) as plain text."""
    roles = [message["role"] for message in messages]
    if roles not in (["user"], ["system", "user"]):
        raise PlainPromptError(
            f"a plain prompt is one user message after an optional system one, not {roles}"
        )
    question = f"Question: {messages[-1]['content'].strip()}\nAnswer:"
    if roles[0] == "system":
        return f"{messages[0]['content'].strip()}\n\n{question}"
    return question


def cut_at_stop(text: str, stop: tuple[str, ...], *, kept: bool = False) -> str:
    """`text` up to the first stop string (through it when `kept`), as the servers return a
    stopped completion."""
    ends = [position + (len(s) if kept else 0) for s in stop if (position := text.find(s)) != -1]
    return text[: min(ends)] if ends else text
