"""The checked-in configuration reference is the one the code renders now: a field added,
renamed or re-described without regenerating the page fails here, with the command to fix it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from asyncrl.cli import COMMANDS
from asyncrl.config.help import iter_fields
from asyncrl.config.reference import render_command, render_reference
from asyncrl.config.rl import RLConfig
from asyncrl.config.trainer import TrainerConfig

PAGE = Path(__file__).resolve().parents[3] / "docs" / "config-reference.md"


def test_checked_in_reference_is_up_to_date() -> None:
    rendered = render_reference((name, c.summary, c.config) for name, c in COMMANDS.items())
    assert PAGE.read_text() == rendered, (
        "docs/config-reference.md is stale: run "
        "`python -m asyncrl.config.reference > docs/config-reference.md`"
    )


def test_reference_rows_carry_key_type_default_and_description() -> None:
    class Inner(BaseModel):
        rate: float = Field(0.5, description="How | often.")

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner, description="A section.")

    rows = render_command("demo", "A demo.", Outer)
    assert "| **`inner`** | section | | A section. |" in rows
    assert "| `inner.rate` | `float` | `0.5` | How \\| often. |" in rows  # pipes escaped


def test_a_wired_section_is_listed_where_its_role_stands_alone_not_again_under_rl() -> None:
    """`trainer.colocated_inference` is `inference` again (42 keys), filled by `asyncrl rl`: its
    help and reference list it once, under `inference`; `asyncrl train` alone still takes it."""
    under_rl = [path for path, *_ in iter_fields(RLConfig)]
    assert "inference.port" in under_rl
    assert not [path for path in under_rl if "colocated_inference" in path]
    alone = [path for path, *_ in iter_fields(TrainerConfig)]
    assert "colocated_inference.port" in alone
    assert "| `colocated_inference` | `inference` |" in PAGE.read_text()


def test_under_rl_every_shared_setting_has_one_name() -> None:
    """The shared settings are listed once, at the top, under `asyncrl rl`; each role's own
    name for one is listed where that role stands alone, with the name to use under rl."""
    from asyncrl.config.rl_wiring import SHARED_FIELDS

    under_rl = {path for path, *_ in iter_fields(RLConfig)}
    for shared, role_paths in SHARED_FIELDS.items():
        assert shared in under_rl, shared
        assert not under_rl & {".".join(path) for path in role_paths}, shared
        for path in role_paths:  # e.g. the trainer's `save_steps` where `asyncrl train` is
            assert f"| `{'.'.join(path[1:])}` |" in PAGE.read_text() or any(
                f"| `{'.'.join(path[1:i])}` |" in PAGE.read_text() for i in range(2, len(path))
            ), path
