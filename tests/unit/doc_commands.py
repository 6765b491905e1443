"""The commands the docs show, found and split as the shell would: each `asyncrl …` and
`make …` of README.md, docs/*.md (fenced shell blocks and inline code), the example configs'
comments (`examples/**/*.yaml`) and the Makefile's recipes. `test_doc_commands.py` checks them
against the CLI; `test_examples.py` that every example names the command that runs it.

Placeholders are made words the CLI can read: `<…>` and `$(…)` become one word, `[-…]` (an
optional part of a synopsis) is left out, and `…` ends a command.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
ENV = r"(?:[A-Z][A-Z0-9_]*=\S*\s+)*"
COMMAND = re.compile(rf"(?:^|(?<=[\s:(])){ENV}(?:\S*/bin/)?asyncrl(?:\.cli)?\s+\S.*")
MAKE = re.compile(rf"^{ENV}make(?:\s.*)?$")
PYTHON_M = re.compile(r"(?<=-m )asyncrl\.cli\s.*")  # `python -m …run … -m asyncrl.cli train …`


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str
    partial: bool  # inline code in prose: part of a command, checked on the stand-in config


def _code_spans(text: str, first_line: int, where: str) -> list[DocCommand]:
    """`asyncrl …` and `make …` in the inline code of `text` (prose), which starts at line
    `first_line` of `where`; a span may run over a line break."""
    found, line = [], first_line
    for index, part in enumerate(text.split("`")):
        span = " ".join(part.split())
        if index % 2 and (COMMAND.match(span) or MAKE.match(span)):
            found.append(DocCommand(f"{where}:{line}", span, partial=True))
        line += part.count("\n")
    return found


def _joined(lines: list[str], index: int) -> tuple[str, int]:
    """Line `index` with its `\\` continuations; the index of its last line."""
    text = lines[index]
    while text.rstrip().endswith("\\") and index + 1 < len(lines):
        index += 1
        text = text.rstrip()[:-1] + " " + lines[index].strip().lstrip("#").strip()
    return text, index


def commands_in_page(path: Path) -> list[DocCommand]:
    where = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    found, prose, prose_start, fence, index = [], [], 1, None, 0
    while index < len(lines):
        line = lines[index]
        if line.lstrip().startswith("```"):
            if fence is None:
                fence = line.strip()[3:].strip()
                found += _code_spans("\n".join(prose), prose_start, where)
            else:
                fence, prose, prose_start = None, [], index + 2
            index += 1
            continue
        if fence is None:
            prose.append(line)
        elif fence in SHELL_FENCES and not line.lstrip().startswith("#"):
            text, last = _joined(lines, index)
            text = text.strip().removeprefix("$ ")
            match = MAKE.match(text) or COMMAND.match(text) or PYTHON_M.search(text)
            if match:
                found.append(DocCommand(f"{where}:{index + 1}", match.group(0), partial=False))
            index = last
        index += 1
    return found + _code_spans("\n".join(prose), prose_start, where)


def commands_in_example(path: Path) -> list[DocCommand]:
    """Commands in a config's comments: inline code, or a comment line that runs one
    (`#   asyncrl rl …`, `# Terminal 1: asyncrl infer …`), with its `\\` continuations."""
    where = str(path.relative_to(ROOT))
    comments = [
        line.partition("#")[2] if "#" in line else "" for line in path.read_text().splitlines()
    ]
    found, index = [], 0
    while index < len(comments):
        text, last = _joined(comments, index)
        if "`" in text:
            found += _code_spans(text, index + 1, where)
        elif match := COMMAND.search(text):
            # a note after the command, set off by spaces: `… --output_dir x   (from …)`
            command = re.sub(r"\s{2,}\(.*\)\s*$", "", match.group(0))
            found.append(DocCommand(f"{where}:{index + 1}", command, partial=False))
        index = last + 1
    return found


def commands_in_makefile() -> list[DocCommand]:
    """The `asyncrl` commands of the Makefile's recipes, its variables expanded."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    variables = {}
    for line in lines:
        if match := re.match(r"^([A-Z_0-9]+)\s*(?:\?=|:=|=)\s*(.*)$", line):
            variables[match[1]] = match[2].strip()

    def expand(text: str) -> str:
        for _ in range(5):
            text = re.sub(r"\$\(([A-Z_0-9]+)\)", lambda m: variables.get(m[1], ""), text)
        return text.replace("$$(", "$(")  # the shell's $(…), substituted in words()

    found, index = [], 0
    while index < len(lines):
        text, last = _joined(lines, index)
        if lines[index].startswith("\t") and (match := COMMAND.search(expand(text))):
            found.append(DocCommand(f"Makefile:{index + 1}", match.group(0), partial=False))
        index = last + 1
    return found


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if match := re.match(r"^([\w.$()-][\w.$() -]*?)\s*:(?![=])", line):
            targets.update(match[1].split())
    return targets


def all_commands() -> list[DocCommand]:
    found = [command for page in PAGES for command in commands_in_page(page)]
    found += [command for path in EXAMPLES for command in commands_in_example(path)]
    return found + commands_in_makefile()


def words(command: DocCommand) -> tuple[dict[str, str], list[str]]:
    """The environment a command sets and its words, as the shell splits them, placeholders
    substituted (module docstring)."""
    text = re.sub(r"\$\((?:[^()]|\([^()]*\))*\)", "SUBSTITUTED", command.text)
    text = re.sub(r"<[^<>]*>", "PLACEHOLDER", text)
    text = re.sub(r"\[-[^\]]*\]", "", text).split("…")[0]
    tokens = shlex.split(text, comments=True)
    environment = {}
    while tokens and re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", tokens[0]):
        key, _, value = tokens.pop(0).partition("=")
        environment[key] = value
    return environment, tokens
