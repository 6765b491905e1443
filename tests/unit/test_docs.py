"""The user-facing docs stay readable and self-contained: the README short enough to read in
one sitting, every link in the README and `docs/` resolving to a file of this repository (no
`../` outside it, no page that moved away), and no measurement of the day in the README."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_at_most_250_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_every_link_stays_in_the_repository_and_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if target.startswith("#"):
                continue  # a heading on the same page
            path = (page.parent / target.split("#")[0]).resolve()
            if target.startswith(("http:", "https:")) or not path.is_relative_to(ROOT):
                broken.append(f"{page.name}: {target} leaves the repository")
            elif not path.exists():
                broken.append(f"{page.name}: {target} does not exist")
    assert not broken, "\n".join(broken)


def test_no_page_points_outside_the_repository_in_prose() -> None:
    outside = [
        f"{page.name}: {match}"
        for page in PAGES
        for match in re.findall(r"\.\./shared\S*|seeds/\S+\.md", page.read_text())
    ]
    assert not outside, "\n".join(outside)


def test_every_metric_the_code_names_is_in_the_glossary() -> None:
    """docs/metrics.md explains each metric a run logs: the names written literally in the
    source (`orchestrator/…`, `trainer/…`, `inference/…`) and every value of a trainer step."""
    from asyncrl.trainer.step_stats import StepStats

    glossary = (ROOT / "docs" / "metrics.md").read_text()
    source = "\n".join(p.read_text() for p in sorted((ROOT / "src").rglob("*.py")))
    named = set(re.findall(r'"((?:orchestrator|trainer|inference)/[a-z_]+(?:/[a-z_]+)*)"', source))
    named |= {f"trainer/{key}" for key in StepStats().summary()}
    missing = sorted(name for name in named if f"`{name}`" not in glossary)
    assert not missing, f"not in docs/metrics.md: {missing}"


def test_defaults_the_docs_quote_are_the_codes() -> None:
    """A page that says "`key` (default V)" says what the code does: V is the default of every
    config field with that key path or name, in any command (`asyncrl <command> --help`)."""
    import ast

    from asyncrl.cli import COMMANDS
    from asyncrl.config.help import iter_fields

    defaults: dict[str, set[str]] = {}
    for command in COMMANDS.values():
        for path, _, default, _ in iter_fields(command.config):
            for key in {path, path.rsplit(".", 1)[-1]}:
                defaults.setdefault(key, set()).add(default)
    quoted = re.compile(r"`([a-z_][a-z0-9_.]*)`[^(`|]{0,30}\(default `?([^`()]+?)`?\)")

    def parsed(text: str) -> object:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text  # a bare word: a string default

    wrong, checked = [], 0
    for page in PAGES:
        for key, said in quoted.findall(page.read_text()):
            if key not in defaults or (" " in said and parsed(said) == said):
                continue  # not a key, or prose ("0 to 10")
            checked += 1
            if parsed(said) not in [parsed(default) for default in defaults[key]]:
                wrong.append(f"{page.name}: `{key}` (default {said}); the code: {defaults[key]}")
    assert checked >= 3, "the pattern no longer finds the docs' quoted defaults"
    assert not wrong, "\n".join(wrong)


def test_every_file_the_readme_code_map_names_exists() -> None:
    """The "Where the code is" table names files under src/asyncrl/: a file moved or renamed
    without the map following fails here."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Where the code is", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]  # past the header
    named = re.findall(r"`([\w/]+\.py)`", "\n".join(rows))
    assert len(named) > 15
    missing = [path for path in named if not (ROOT / "src" / "asyncrl" / path).exists()]
    assert not missing, missing


def test_every_page_is_in_the_readme_docs_index() -> None:
    """A page under docs/ that the README's documentation table does not link is a page a new
    user never finds."""
    text = (ROOT / "README.md").read_text()
    index = text.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    linked = {Path(target).name for target in LINK.findall(index)}
    missing = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name not in linked)
    assert not missing, f"not in the README's docs index: {missing}"


MEASURED_PAGES = ["settings.md", "hardware.md"]  # pages whose figures are all measured ones


def test_the_measured_pages_quote_only_figures_of_the_results_file() -> None:
    """docs/settings.md and docs/hardware.md give measurements as evidence: every number in
    their prose and tables (code aside) is one benchmarks/RESULTS.md holds, so a figure
    mistyped, or one estimated rather than measured, fails here."""
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    unknown = []
    for name in MEASURED_PAGES:
        prose = re.sub(r"```.*?```", "", (ROOT / "docs" / name).read_text(), flags=re.S)
        prose = re.sub(r"`[^`]*`|\]\([^)]*\)", "", prose)  # code, link targets
        for number in set(re.findall(r"\d+(?:[.,]\d+)*", prose)):
            if not re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", results):
                unknown.append(f"{name}: {number}")
    assert not unknown, f"figures not in benchmarks/RESULTS.md: {sorted(unknown)}"


def test_the_readmes_two_commands_set_up_and_run_the_real_model_quick_start_and_the_tests(
    tmp_path: Path,
) -> None:
    """The README opens with the job a newcomer came for and the tests, each setting up what it
    needs: `make demo` installs .venv, then runs RL of the real pretrained model (the tiny
    from-scratch one is `make demo-tiny`); `make test` installs both venvs and runs pytest. Read
    from what make would run (`make -n`, a venv that does not exist yet), not from comments."""
    import subprocess

    first_block = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["make demo", "make test"]

    def dry_run(target: str) -> str:
        return subprocess.run(
            ["make", "-n", target, f"VENV={tmp_path / 'venv'}", f"VLLM_VENV={tmp_path / 'vllm'}"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    demo = dry_run("demo")
    assert "bash scripts/setup.sh" in demo
    assert "asyncrl rl examples/smollm2_chain_sum/rl.yaml" in demo
    assert dry_run("demo-smollm2") == demo
    assert "asyncrl rl examples/reverse_text/rl.yaml" in dry_run("demo-tiny")
    tests = dry_run("test")
    assert "bash scripts/setup.sh" in tests and "bash scripts/setup_vllm.sh" in tests
    assert "-m pytest" in tests
