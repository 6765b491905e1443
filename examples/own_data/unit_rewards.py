"""The reward of examples/own_data: a number with its unit, checked against the data's columns.

`asyncrl` calls `score(completion, example)` in its isolated reward workers. `example.answer`
is the line's `answer`; every other column of the line is in `example.info` (here `unit` and
`tolerance`). Importable when this folder is on PYTHONPATH (docs/own-data.md).
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(completion: str, example) -> float:  # example: asyncrl.envs.base.Example
    """1 for the right number followed by the asked unit, 0.5 for the right number alone, else 0."""
    text = completion.replace(",", "")
    numbers = NUMBER.findall(text)
    if not numbers:
        return 0.0
    last = numbers[-1]
    tolerance = float(example.info.get("tolerance", 0))
    if abs(float(last) - float(example.answer)) > tolerance:
        return 0.0
    unit = re.escape(example.info["unit"])
    return 1.0 if re.search(rf"{re.escape(last)}\s*{unit}\b", text) else 0.5
