"""A judge's answer read as a score, two ways: a number in its text, or the probability of a
verdict token at its first position (from the endpoint's top logprobs). Pure functions over the
parsed JSON of an OpenAI chat completion; None means "no score in this answer" (unparseable).
"""

from __future__ import annotations

import math
import re
from typing import Any


def number_score(text: str, pattern: re.Pattern[str], scale: tuple[float, float]) -> float | None:
    """The first match of `pattern` (its first group, if it has one) mapped from `scale` =
    [low, high] onto [0, 1]; None without a match, or for a number outside the scale."""
    match = pattern.search(text)
    if match is None:
        return None
    try:
        number = float(match.group(1) if pattern.groups else match.group(0))
    except (TypeError, ValueError):  # a group that did not take part, or not a number
        return None
    low, high = scale
    if not (math.isfinite(number) and low <= number <= high):
        return None
    return (number - low) / (high - low)


def first_token_alternatives(choice: dict[str, Any]) -> list[tuple[str, float]]:
    """(token, logprob) of the answer's first position: the sampled token and its top
    alternatives, as a chat completion's `logprobs.content[0]` gives them."""
    content = (choice.get("logprobs") or {}).get("content") or []
    if not content:
        return []
    first = content[0]
    pairs = [(str(first["token"]), float(first["logprob"]))]
    pairs += [(str(top["token"]), float(top["logprob"])) for top in first.get("top_logprobs") or []]
    return pairs


def verdict_score(
    alternatives: list[tuple[str, float]], verdicts: dict[str, float]
) -> float | None:
    """Σ p(v)·value(v) / Σ p(v) over the verdict tokens among `alternatives` (tokens compared
    without surrounding spaces, each token counted once, spellings of one verdict added up);
    None when no verdict is among them."""
    wanted = {token.strip(): value for token, value in verdicts.items()}
    seen: set[str] = set()
    mass, weighted = 0.0, 0.0
    for token, logprob in alternatives:
        if token in seen:
            continue
        seen.add(token)
        value = wanted.get(token.strip())
        if value is None:
            continue
        probability = math.exp(logprob)
        mass += probability
        weighted += probability * value
    if mass <= 0.0:
        return None
    return weighted / mass
