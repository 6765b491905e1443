"""The variables a config lets reach the processes that run a user's code (reward workers and
their tools, scorers, the import check: `user_code.py`), beyond the allowlist every one of them
gets: a credential a reward needs (`HF_TOKEN` for a gated reward model), a setting of its own."""

from __future__ import annotations

import re

from pydantic import Field

from asyncrl.run_secret import ALWAYS_WITHHELD

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def passthrough_field(processes: str) -> list[str]:
    """The config field (`reward_env_passthrough`, `env_passthrough`) for `processes`."""
    return Field(  # type: ignore[no-any-return]
        default_factory=list,
        description=f"Environment variables, by exact name, passed to {processes}, beside the "
        "allowlist always passed (PATH, HOME, LANG/LC_*, TMPDIR, PYTHON*, thread counts, cache "
        "locations; docs/security.md). Everything else stays out, your credentials included "
        "(`HF_TOKEN`, `WANDB_API_KEY`, `AWS_*`, `SSH_AUTH_SOCK`); name one here if that code "
        "needs it. A key of the run (the run's secret, an `api_key_var`) is refused.",
    )


def checked_passthrough(names: list[str], keys: list[str | None]) -> list[str]:
    """`names`, or ValueError naming the first that is not a variable name or is a key of the
    run (`ALWAYS_WITHHELD`, or one of `keys`: the config's `api_key_var`s)."""
    forbidden = {*ALWAYS_WITHHELD, *(key for key in keys if key)}
    for name in names:
        if not _NAME.match(name):
            raise ValueError(f"`{name}` is not an environment variable's name (a pattern or a "
                             "value?): name each variable whole")  # fmt: skip
        if name in forbidden:
            raise ValueError(
                f"`{name}` holds a key of the run: no process that runs your code may have it "
                "(every channel of the run is keyed by it)"
            )
    return names
