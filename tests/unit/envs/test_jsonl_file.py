"""Reading a JSONL file: lines end at `\\n` only, the bytes are UTF-8, numbers are numbers, and
every refusal names the file and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.envs.jsonl_file import read_jsonl


def test_a_line_holding_unicode_line_separators_stays_one_record(tmp_path: Path) -> None:
    """JSON allows U+2028, U+2029 and U+0085 unescaped in a string; `splitlines` broke there."""
    text = '{"input": "a\u2028b\u2029c\u0085d"}\n{"input": "second"}\r\n\n{"input": "fourth"}\n'
    path = tmp_path / "d.jsonl"
    path.write_bytes(text.encode())
    records = read_jsonl(path)
    assert [number for number, _ in records] == [1, 2, 4]
    assert records[0][1]["input"] == "a\u2028b\u2029c\u0085d"
    assert records[1][1]["input"] == "second"  # the \r of a Windows line ending is dropped


def test_bytes_that_are_not_utf8_are_refused_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"input": "ok"}\n{"input": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:2: not UTF-8 \(byte 15 of the line"):
        read_jsonl(path)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json_numbers(tmp_path: Path, constant: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(f'{{"input": "q", "answer": "a"}}\n{{"input": "q", "weight": {constant}}}\n')
    with pytest.raises(ValueError, match=rf"d\.jsonl:2: not JSON \(`{constant}` is not a JSON"):
        read_jsonl(path)
