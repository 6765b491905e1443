"""`asyncrl train` with `world_size` > 1 on one machine: start the ranks, and stop them together.

The process starts `world_size` copies of `asyncrl train <resolved config>` with RANK,
LOCAL_RANK, WORLD_SIZE and MASTER_ADDR / MASTER_PORT set, as torch's launchers do, and waits:
when one rank fails, it stops the others and exits with that rank's code, naming the rank and
how it ended; when every rank has finished, it exits 0. SIGTERM or Ctrl-C stop every rank.

It replaces torchrun here because torchrun's own stores listen on every interface with no
authentication. The ranks' store (`rank_store.py`) is bound to 127.0.0.1 on a port free now,
gloo's connections to the loopback interface, and the ranks share the run's secret (the one
this process holds, or a fresh one), handed to each with this process's keys over a socket
(`secret_handover.py`), never in its environment. The ranks run in this process's group, so a
supervisor that kills the group kills them too, and each dies if this process dies
(PR_SET_PDEATHSIG).
Each beats its own heartbeat file (`heartbeat.py`), so one frozen rank shows.

On several nodes, run torchrun yourself on each node with a matching total (`--nnodes`,
`--node-rank`, `--rdzv-endpoint`); `asyncrl train` then sees RANK set and runs as one rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

import yaml

from asyncrl.config.trainer import TrainerConfig
from asyncrl.lifetime import die_with_parent
from asyncrl.log import get_logger
from asyncrl.ports import free_ports
from asyncrl.run.layout import config_file
from asyncrl.run_secret import RUN_SECRET_ENV, held_keys, new_run_secret, run_secret
from asyncrl.secret_handover import Handover

logger = get_logger(__name__)

LOOPBACK = "127.0.0.1"
STOP_GRACE = 15.0  # seconds the other ranks get to stop before SIGKILL


def started_by_a_launcher() -> bool:
    """True inside a rank that this launcher (or torchrun) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def exec_ranks(config: TrainerConfig) -> None:
    """Run `world_size` ranks of this config on this machine; exits with their outcome."""
    path = config_file(config.output_dir, "trainer_ranks")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    command = [sys.executable, "-m", "asyncrl.cli", "train", str(path)]
    logger.info("trainer: starting %d ranks of %s", config.world_size, " ".join(command))
    sys.exit(run_ranks(command, config.world_size))


def rank_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    environment = {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port),
    }  # fmt: skip
    if sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
        environment["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's own connections: loopback too
    return environment


def run_ranks(command: Sequence[str], world_size: int) -> int:
    """Start `command` as ranks 0..world_size-1 and wait for them; their exit code."""
    (port,) = free_ports(1, LOOPBACK)
    keys = {**held_keys(), RUN_SECRET_ENV: run_secret() or new_run_secret()}
    ranks: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        for rank in range(world_size):
            handover = Handover(keys)
            environment = {**os.environ, **rank_environment(rank, world_size, port),
                           **handover.environment}  # fmt: skip
            try:
                process = subprocess.Popen(
                    list(command), env=environment, stdin=subprocess.DEVNULL,
                    preexec_fn=die_with_parent, pass_fds=(handover.descriptor,),
                )  # fmt: skip
            finally:
                handover.close()
            ranks.append(process)
        return _wait(ranks)
    finally:
        _stop(ranks)


def _wait(ranks: list[subprocess.Popen[bytes]]) -> int:
    while True:
        codes = [rank.poll() for rank in ranks]
        failed = [(r, code) for r, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank, code = failed[0]
            assert code is not None
            ending = f"code {code}" if code > 0 else signal.Signals(-code).name
            logger.error("trainer: rank %d exited (%s); stopping the other ranks", rank, ending)
            return code if code > 0 else 128 - code
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.2)


def _stop(ranks: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every rank still running, SIGKILL those still there after STOP_GRACE."""
    running = [rank for rank in ranks if rank.poll() is None]
    for rank in running:
        rank.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for rank in running:
        try:
            rank.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rank.kill()
            rank.wait()
