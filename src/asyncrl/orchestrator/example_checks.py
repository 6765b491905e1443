"""One bad example costs that example, never the run.

What can be judged before the first request is judged at start-up (`check_prompt_ids`): every
pre-tokenized prompt, trained or evaluated, local or from an env-server, against the
tokenizer's vocabulary and `seq_len`, refused with its source (file:line). What only a server
can judge (its own length or size limits, a prompt it cannot tokenize) comes back as a 4xx on
that example's request: `Rejections` skips the example, counts it
(`orchestrator/rejected_examples`) and logs the first refusal of each source. A refusal that is
not about the example (a wrong key, an unknown model) stops the run at once, and so does a
streak of refusals with no group in between: every example refused is a server that refuses
everything, not bad data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from asyncrl.config.base import ConfigError
from asyncrl.envs.base import Example
from asyncrl.envs.prompt_ids import limit_problem, shape_problem
from asyncrl.log import get_logger
from asyncrl.orchestrator.generation import RequestRejected

logger = get_logger(__name__)


def source_of(example: Example, env_name: str) -> str:
    """Where an example was read (`file:line`), or its environment and id."""
    return example.source or f"env `{env_name}` example {example.example_id}"


def check_prompt_ids(
    examples: Iterable[tuple[str, Sequence[Example]]],
    vocab_size: int,
    seq_len: int,
    max_tokens: int | None,
) -> None:
    """ConfigError naming the first example, per environment name in `examples`, whose
    pre-tokenized prompt the model cannot take: not a list of ids, an id outside the
    vocabulary, or too long to leave `max_tokens` within `seq_len`."""
    for env_name, env_examples in examples:
        for example in env_examples:
            ids = example.prompt_token_ids
            if ids is None:
                continue
            problem = shape_problem(ids) or limit_problem(ids, vocab_size, seq_len, max_tokens)
            if problem is not None:
                raise ConfigError(f"{source_of(example, env_name)}: {problem}")


class Rejections:
    """Examples the servers refused, skipped: counted per step, each source logged once."""

    def __init__(self, give_up_after: int) -> None:
        self.give_up_after = give_up_after
        self.since_last_batch = 0
        self.in_a_row = 0
        self.logged: set[str] = set()

    def skip(self, example: Example, env_name: str, error: RequestRejected) -> None:
        """Count the refused example, or re-raise: a refusal not of the example, or the
        `give_up_after`-th in a row (RuntimeError naming the source and the server's reason)."""
        source = source_of(example, env_name)
        if not error.of_example:
            raise RuntimeError(
                f"orchestrator: the inference server refused a request for {source}, not for "
                f"its content ({error}): every request would be refused"
            ) from error
        self.since_last_batch += 1
        self.in_a_row += 1
        if self.in_a_row >= self.give_up_after:
            raise RuntimeError(
                f"orchestrator: {self.in_a_row} examples in a row were refused by the inference "
                f"servers, the last {source} ({error}): a server that refuses every request, "
                "not one bad example"
            ) from error
        if source not in self.logged:
            self.logged.add(source)
            logger.warning(
                "orchestrator: %s is skipped: %s (counted in orchestrator/rejected_examples; "
                "further refusals of it are not logged)", source, error,
            )  # fmt: skip

    def served(self) -> None:
        """A group was generated: the streak of refusals is broken."""
        self.in_a_row = 0

    def metrics(self) -> dict[str, float]:
        """`orchestrator/rejected_examples`: refusals since the last batch (then reset)."""
        count, self.since_last_batch = self.since_last_batch, 0
        return {"orchestrator/rejected_examples": float(count)}
