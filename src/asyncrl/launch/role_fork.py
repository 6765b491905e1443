"""Role processes forked from the launcher, which has imported torch and transformers once.

Every role imports torch and transformers' model classes before it does anything: 2.7-4.5 s of
one core per process (orchestrator, trainer, inference), and again at every restart. The local
launcher imports them once (`preload`) and forks each role from itself: the child starts with
them in memory (shared copy-on-write) and runs `asyncrl <role> <config>` as a fresh interpreter
would, in its own session, dying with the launcher, its output in its log, its environment, its
signals, its exit code and its command line (`ps`) those of `python -m asyncrl.cli <role> ...`.

What a fork must not carry over, and does not: the launcher's threads (a fork happens only while
the launcher runs no other Python thread; else the role is started by exec, as before), its
open files (closed in the child, as `close_fds` does), its signal handlers and atexit hooks, its
logging handlers and console, its torch thread count (libgomp read `OMP_NUM_THREADS` when the
launcher imported torch, so the child sets the role's own), its torch and numpy random states, the
keys it holds (the child holds the role's own, handed over in memory, never in its environment).
The launcher only imports: it never runs a torch kernel, so no OpenMP pool is forked mid-use. It
is not dumpable (`process_privacy.py`), and so a forked role is not either, from its first
instruction.

`role_start: exec` in the run's config turns this off (a fresh interpreter per role), and so
does a GPU driver on the machine: the launcher then asks CUDA how many devices there are, which
initializes a driver that no forked child may use.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from asyncrl.gpu_presence import could_have_gpus
from asyncrl.lifetime import die_with_parent
from asyncrl.log import forget_logging_setup, get_logger
from asyncrl.run_secret import adopt

logger = get_logger(__name__)

# what the roles import before their first step (their union); asyncrl's own modules are left to
# the roles (0.1 s each), so the launcher holds no role's code
PRELOAD = (
    "torch",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "fastapi",
    "uvicorn",
    "httpx",
)

_preloaded = False
SESSION_DEADLINE_S = 30.0  # a child that has not set its session by then is left to `poll`


def forking_roles(role_start: str) -> bool:
    """Whether this launcher forks its roles: asked to, on a machine without a GPU driver."""
    return role_start == "fork" and hasattr(os, "fork") and not could_have_gpus()


def role_command(command: Sequence[str]) -> list[str] | None:
    """The `asyncrl` arguments of a command this launcher can fork (`python -m asyncrl.cli ...`
    with this very interpreter), else None."""
    if len(command) >= 4 and list(command[:3]) == [sys.executable, "-m", "asyncrl.cli"]:
        return list(command[3:])
    return None


def can_fork_now() -> bool:
    """Forking is safe while this process runs no other Python thread (a thread's held lock
    would stay held in the child)."""
    return hasattr(os, "fork") and threading.active_count() == 1


def preload() -> None:
    """Import what the roles import, once per launcher."""
    global _preloaded
    if _preloaded:
        return
    began = time.monotonic()
    with contextlib.suppress(ImportError):  # finds the command line's memory, which it can
        from setproctitle import getproctitle  # only while the environment is as exec left it

        getproctitle()
    for module in PRELOAD:
        with contextlib.suppress(ImportError):  # an optional module a role may never need
            importlib.import_module(module)
    _preloaded = True
    logger.info("rl: roles start forked; imported torch and transformers once in %.1f s",
                time.monotonic() - began)  # fmt: skip


class ForkedRole:
    """A forked role, watched like a `subprocess.Popen`: `pid`, `args`, `poll()`, `wait()`,
    `returncode` (negative: the signal that ended it)."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        assert self.returncode is not None
        return self.returncode


def fork_role(
    command: Sequence[str],
    log_path: Path,
    env: dict[str, str],
    keys: Mapping[str, str] | None = None,
) -> ForkedRole:
    """Start `command` (`python -m asyncrl.cli <role> ...`, see `role_command`) as a child of
    this process without a new interpreter: its output appended to `log_path`, `env` on top of
    ours, in a session of its own, dying with us, holding `keys` and no others in memory (not in
    its environment; as not dumpable as this launcher, from its first instruction)."""
    arguments = role_command(command)
    if arguments is None:
        raise ValueError(f"not an asyncrl command of this interpreter: {list(command)}")
    preload()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):  # nothing of ours is written twice
        with contextlib.suppress(Exception):
            stream.flush()
    ready, said_ready = os.pipe()
    pid = os.fork()
    if pid == 0:  # the role; never returns
        _run_role_in_child(list(command), arguments, log, env, dict(keys or {}), said_ready)
    os.close(log)
    os.close(said_ready)
    # back only once the child leads its own process group, as `Popen(start_new_session=True)`
    # returns: a `killpg` sent before would miss it (a role restarted as the run ends)
    with contextlib.suppress(OSError):
        if select.select([ready], [], [], SESSION_DEADLINE_S)[0]:
            os.read(ready, 1)  # a byte: its session is set; nothing: it died first
    os.close(ready)
    return ForkedRole(pid, list(command))


def _run_role_in_child(
    command: list[str],
    arguments: list[str],
    log: int,
    env: dict[str, str],
    keys: dict[str, str],
    said_ready: int,
) -> NoReturn:
    code = 1
    try:
        os.setsid()
        die_with_parent()
        os.write(said_ready, b"1")
        _become_a_fresh_role_process(command, log, env)
        adopt(keys, only=True)
        code = _run_cli(arguments)
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        os._exit(_exit_as_an_interpreter_does(code))


def _become_a_fresh_role_process(command: list[str], log: int, env: dict[str, str]) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, _max_fd())
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # the launcher's hooks are the launcher's
    forget_logging_setup()
    os.environ.update(env)
    sys.argv = [sys.argv[0], *command[3:]]
    _set_title(command)
    _take_own_threads_and_randomness()


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 65536


def _set_title(command: list[str]) -> None:
    """`ps` and /proc/<pid>/cmdline show the role's own command, as after an exec."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(" ".join(command))


def _take_own_threads_and_randomness() -> None:
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    if torch is not None:  # else every role, and every restart, drew the launcher's numbers:
        torch.seed()  # two replicas sampled with one stream, a restarted server replayed it
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # a fresh interpreter seeds from the OS, not from its parent


def _run_cli(arguments: list[str]) -> int:
    from asyncrl.cli import main

    try:
        return main(arguments)
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1


def _exit_as_an_interpreter_does(code: int) -> int:
    """What Python does after `main` returns: wait for non-daemon threads, run atexit hooks,
    flush the streams; then the exit code."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    return code
