"""The project's one logger: rich output on a terminal, plain lines in files and CI."""

from __future__ import annotations

import logging
import os
import sys

from rich.console import Console
from rich.logging import RichHandler

_ROOT = "asyncrl"
_configured = False

console = Console(stderr=True)


def setup_logging(level: str | None = None, log_file: str | None = None) -> None:
    """Configure the `asyncrl` logger once per process; level from ASYNCRL_LOG_LEVEL by default."""
    global _configured
    root = logging.getLogger(_ROOT)
    root.setLevel((level or os.environ.get("ASYNCRL_LOG_LEVEL", "INFO")).upper())
    if not _configured:
        if sys.stderr.isatty():
            handler: logging.Handler = RichHandler(console=console, show_path=False)
            handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
        else:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
            )
        root.addHandler(handler)
        root.propagate = False
        _configured = True
    if log_file is not None:
        file_handler = logging.FileHandler(log_file)
        file_handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        root.addHandler(file_handler)


def forget_logging_setup() -> None:
    """Undo `setup_logging` in a process forked from one that had set it up (a role forked by the
    launcher, `launch/role_fork.py`): its handlers wrote to the parent's streams."""
    global _configured
    root = logging.getLogger(_ROOT)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    _configured = False


def get_logger(name: str) -> logging.Logger:
    """A child of the `asyncrl` logger; `name` is usually `__name__`."""
    if not name.startswith(_ROOT):
        name = f"{_ROOT}.{name}"
    return logging.getLogger(name)
