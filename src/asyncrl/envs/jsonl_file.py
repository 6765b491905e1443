"""Reading JSONL data files: every record with its line number, errors naming file and line.

A line ends at `\\n` (a `\\r` before it is dropped) and nowhere else: JSON allows U+2028,
U+2029 and U+0085 unescaped inside strings, and `str.splitlines` would break a record there and
shift every later line number. The bytes must be UTF-8 (JSON's encoding), and a number must be
a number: `NaN` and `Infinity`, which Python's json module takes by default, are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) for every non-blank line; a bad line raises naming path:line."""
    records = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            line = raw.removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path}:{number}: not UTF-8 (byte {error.start + 1} of the line: "
                f"{raw[error.start : error.start + 1]!r}); JSONL files are UTF-8"
            ) from None
        if not line.strip():
            continue
        try:
            record = json.loads(line, parse_constant=_refuse_constant)
        except (json.JSONDecodeError, _NotANumber) as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: not a JSON object")
        records.append((number, record))
    return records


class _NotANumber(ValueError):
    """`NaN`, `Infinity` or `-Infinity`: Python extensions, not JSON."""


def _refuse_constant(name: str) -> Any:
    raise _NotANumber(f"`{name}` is not a JSON number")
