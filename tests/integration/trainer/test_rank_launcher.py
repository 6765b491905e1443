"""`asyncrl train` on two ranks, as real processes: nothing of theirs listens beyond loopback,
a stranger without the run's secret cannot take a rank, each rank's heartbeat is its own (one
frozen rank shows), and one rank's death stops the other and the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.heartbeat import silent_for
from asyncrl.launch.inference_process import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "the-secret-of-this-test-run"


def children(pid: int) -> list[int]:
    """Every descendant of `pid`."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")")[1].split()[1]
                )
            except (OSError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent:
                found.append(child)
                frontier.append(child)
    return found


def listening(pids: list[int]) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket the processes hold (from /proc)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.add((decode_address(address, width), int(port, 16)))
    return found


def decode_address(hex_address: str, width: int) -> str:
    raw = bytes.fromhex(hex_address)
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]  # little-endian 32-bit words
    packed = b"".join(words)
    if width == 8:
        return ".".join(str(b) for b in packed)
    if packed[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in packed[12:])
    return ":".join(packed[i : i + 2].hex() for i in range(0, 16, 2))


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "0000:0000:0000:0000:0000:0000:0000:0001"


def rank_processes(launcher: int) -> list[int]:
    """The rank processes under the launcher, rank 0 first (by RANK in their environment)."""
    ranks = {}
    for pid in children(launcher):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        rank = [e for e in environ if e.startswith(b"RANK=")]
        if rank and b"asyncrl.cli" in command and b"torch.distributed.run" not in command:
            ranks[int(rank[0][5:])] = pid
    return [ranks[r] for r in sorted(ranks)]


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """`asyncrl train` with world_size 2, both ranks initialised and waiting for batch 1."""
    out = tmp_path_factory.mktemp("ranks")
    (out / "run_default").mkdir()
    log = open(out / "train.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "train", "--model", str(tiny_model_dir),
         "--output_dir", str(out), "--world_size", "2", "--max_steps", "2", "--recipe", "fp32"],
        env={**os.environ, "ASYNCRL_HEARTBEAT": str(out / "heartbeat"),
             "ASYNCRL_RUN_SECRET": SECRET},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while (out / "train.log").read_text().count("trainer: run ") < 2:
            assert process.poll() is None, (out / "train.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (out / "train.log").read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(3)  # every rank beats, every socket is open
        yield process, out
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_nothing_of_the_trainers_ranks_listens_beyond_loopback(trainer) -> None:
    process, _ = trainer
    sockets = listening([process.pid, *children(process.pid)])
    assert sockets, "the ranks' store and connections listen somewhere"
    assert all(is_loopback(address) for address, _ in sockets), sockets


def test_a_frozen_rank_shows_in_the_trainers_heartbeat(trainer) -> None:
    process, out = trainer
    ranks = rank_processes(process.pid)
    assert len(ranks) == 2
    assert silent_for(out / "heartbeat") < 2.5
    os.kill(ranks[1], signal.SIGSTOP)  # frozen; its launcher and rank 0 carry on
    try:
        time.sleep(4)
        silent = silent_for(out / "heartbeat")
        assert silent is not None and silent >= 3
    finally:
        os.kill(ranks[1], signal.SIGCONT)
    time.sleep(2)
    assert silent_for(out / "heartbeat") < 2.5


def test_one_ranks_death_stops_the_other_and_the_launcher(trainer) -> None:
    process, out = trainer
    ranks = rank_processes(process.pid)
    os.kill(ranks[1], signal.SIGKILL)
    code = process.wait(timeout=60)
    assert code != 0
    assert (
        not Path(f"/proc/{ranks[0]}").exists()
        or "Z" in Path(f"/proc/{ranks[0]}/stat").read_text().rsplit(")")[1].split()[0]
    )
    assert "rank 1 exited (SIGKILL)" in (out / "train.log").read_text()


RANK = """
import sys, torch, torch.distributed as dist
from asyncrl.trainer.parallel import init_ranks
init_ranks(2, timeout=60)
value = torch.tensor([float(sys.argv[1])])
dist.all_reduce(value)
print("sum", value.item(), flush=True)
"""

STRANGER = """
import os, sys, torch, torch.distributed as dist
from datetime import timedelta
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, is_master=False,
                      timeout=timedelta(seconds=20))
# the keys torch's own env:// rendezvous gives the default process group
dist.init_process_group("gloo", store=dist.PrefixStore("default_pg", store), rank=1, world_size=2,
                        timeout=timedelta(seconds=8))
value = torch.tensor([100.0])
dist.all_reduce(value)
print("joined", value.item(), flush=True)
"""


def test_a_stranger_without_the_secret_cannot_take_a_rank() -> None:
    port = free_port()
    ranks_env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port), "ASYNCRL_RUN_SECRET": SECRET}  # fmt: skip
    stranger_env = {k: v for k, v in os.environ.items() if k != "ASYNCRL_RUN_SECRET"}

    def start(script: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", script, *args], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip

    rank0 = start(RANK, {**ranks_env, "RANK": "0"}, "1")
    time.sleep(5)  # rank 0 hosts the store and waits for rank 1
    stranger = start(STRANGER, stranger_env, str(port))  # comes first, claims rank 1
    stranger_out, _ = stranger.communicate(timeout=120)
    rank1 = start(RANK, {**ranks_env, "RANK": "1"}, "1")
    outs = [rank.communicate(timeout=120)[0] for rank in (rank0, rank1)]
    assert "joined" not in stranger_out and stranger.returncode != 0
    assert outs == ["sum 2.0\n", "sum 2.0\n"]
