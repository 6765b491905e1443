"""The NCCL/gloo weight group outlives any member (gloo here; the same code runs NCCL on GPUs):
real processes, SIGKILLed and started again. A restarted server gets back in and receives the
current weights; a restarted trainer forms a new group that the live servers join by
themselves."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest

from asyncrl.launch.inference_process import free_port

pytestmark = pytest.mark.integration

SERVERS = 2
MODEL = "torch.manual_seed(0); model = torch.nn.Linear(4, 4)"

RECEIVER = f"""
import sys, threading, torch
from asyncrl.transport.nccl_broadcast import WeightReceiver
{MODEL}
receiver = WeightReceiver("127.0.0.1", int(sys.argv[1]), int(sys.argv[2]), {SERVERS + 1}, 30)
while True:
    received = receiver.receive(model, lambda: False, poll=0.2)
    print("received", received.step, received.tensors["weight"][0, 0].item(), flush=True)
"""

SENDER = f"""
import sys, torch
from asyncrl.transport.nccl_broadcast import WeightSender
{MODEL}
sender = WeightSender("127.0.0.1", int(sys.argv[1]), {SERVERS}, 60)
print("formed", flush=True)
for line in sys.stdin:
    command, *value = line.split()
    if command == "send":
        with torch.no_grad():
            model.weight.fill_(float(value[0]))
        sender.send(int(value[0]), model)
    elif command == "admit":
        sender.admit_restarted_servers()
    print("done", command, flush=True)
"""


class Peer:
    """A process running `script`, whose stdout lines are read in the background."""

    def __init__(self, script: str, *args: object) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, *map(str, args)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def expect(self, line: str, timeout: float = 90) -> None:
        """Wait for `line`, skipping others."""
        while True:
            try:
                got = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no `{line}` within {timeout} s") from None
            if got == line:
                return

    def tell(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()


@contextmanager
def weight_group() -> Iterator[tuple[int, list[Peer]]]:
    port = free_port()
    peers: list[Peer] = []
    try:
        yield port, peers
    finally:
        for peer in peers:
            if peer.process.poll() is None:
                peer.kill()


def test_a_restarted_server_is_let_back_in_and_gets_the_current_weights() -> None:
    with weight_group() as (port, peers):
        sender = Peer(SENDER, port)
        servers = [Peer(RECEIVER, port, rank) for rank in range(1, SERVERS + 1)]
        peers += [sender, *servers]
        sender.expect("formed")
        sender.tell("send 1")
        sender.expect("done send")
        for server in servers:
            server.expect("received 1 1.0")

        servers[1].kill()  # between steps: the trainer learns of it when the server is back
        servers[1] = Peer(RECEIVER, port, 2)
        peers.append(servers[1])
        while True:  # the trainer, waiting for a batch, looks for servers asking back in
            sender.tell("admit")
            sender.expect("done admit")
            try:
                servers[1].expect("received 1 1.0", timeout=0.5)
                break
            except AssertionError:
                continue
        servers[0].expect("received 1 1.0")  # sent again to the whole new group

        servers[0].kill()  # now unnoticed until the next send fails on it
        servers[0] = Peer(RECEIVER, port, 1)
        peers.append(servers[0])
        sender.tell("send 2")
        sender.expect("done send")
        for server in servers:
            server.expect("received 2 2.0")


def test_the_servers_join_a_restarted_trainers_group_by_themselves() -> None:
    with weight_group() as (port, peers):
        sender = Peer(SENDER, port)
        servers = [Peer(RECEIVER, port, rank) for rank in range(1, SERVERS + 1)]
        peers += [sender, *servers]
        sender.expect("formed")
        sender.tell("send 1")
        for server in servers:
            server.expect("received 1 1.0")

        sender.kill()
        sender = Peer(SENDER, port)
        peers.append(sender)
        sender.expect("formed")
        sender.tell("send 3")
        sender.expect("done send")
        for server in servers:
            server.expect("received 3 3.0")


def test_with_the_run_secret_a_stranger_on_the_store_changes_nothing(monkeypatch) -> None:
    """Anyone who reaches the store's port can connect to it: without the run's secret it
    cannot ask the trainer to tear the group down (`rejoin`), nor announce a send."""
    import torch.distributed as dist

    monkeypatch.setenv("ASYNCRL_RUN_SECRET", "the-run-secret-of-this-test")  # every peer's
    with weight_group() as (port, peers):
        sender = Peer(SENDER, port)
        servers = [Peer(RECEIVER, port, rank) for rank in range(1, SERVERS + 1)]
        peers += [sender, *servers]
        sender.expect("formed")
        sender.tell("send 1")
        sender.expect("done send")
        for server in servers:
            server.expect("received 1 1.0")

        stranger = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        stranger.add("rejoin", 1)  # the keys the group used before it had a secret
        stranger.set("send_2", "7")
        sender.tell("admit")  # a rebuild would send version 1 to every server again
        sender.expect("done admit")
        for server in servers:
            with pytest.raises(AssertionError, match=r"no `received 1 1\.0`"):
                server.expect("received 1 1.0", timeout=3)
        sender.tell("send 2")
        sender.expect("done send")
        for server in servers:
            server.expect("received 2 2.0")
        del stranger


DELTA_RECEIVER = f"""
import sys, torch
from asyncrl.transport.nccl_broadcast import WeightReceiver
{MODEL}
receiver = WeightReceiver("127.0.0.1", int(sys.argv[1]), int(sys.argv[2]), {SERVERS + 1}, 30)
while True:
    received = receiver.receive(model, lambda: False, poll=0.2)
    kind = "full" if received.blobs is None else "delta"
    print("received", received.step, kind, flush=True)
"""

DELTA_SENDER = SENDER.replace(
    f'sender = WeightSender("127.0.0.1", int(sys.argv[1]), {SERVERS}, 60)',
    "from asyncrl.transport.weights.delta import DeltaPolicy\n"
    f'sender = WeightSender("127.0.0.1", int(sys.argv[1]), {SERVERS}, 60, '
    "delta=DeltaPolicy('on', torch.float32, torch.float32))",
)


def test_a_server_restarted_between_two_versions_gets_them_whole_never_a_delta() -> None:
    """Deltas go only while every member holds the version before: once the group is formed
    again for a restarted server, the current version and the next go whole."""
    assert DELTA_SENDER != SENDER
    with weight_group() as (port, peers):
        sender = Peer(DELTA_SENDER, port)
        servers = [Peer(DELTA_RECEIVER, port, rank) for rank in range(1, SERVERS + 1)]
        peers += [sender, *servers]
        sender.expect("formed")
        for step, kind in ((1, "full"), (2, "delta")):
            sender.tell(f"send {step}")
            sender.expect("done send")
            for server in servers:
                server.expect(f"received {step} {kind}")

        servers[1].kill()
        servers[1] = Peer(DELTA_RECEIVER, port, 2)
        peers.append(servers[1])
        while True:
            sender.tell("admit")
            sender.expect("done admit")
            try:
                servers[1].expect("received 2 full", timeout=0.5)
                break
            except AssertionError:
                continue
        servers[0].expect("received 2 full")
        for step, kind in ((3, "full"), (4, "delta")):
            sender.tell(f"send {step}")
            sender.expect("done send")
            for server in servers:
                server.expect(f"received {step} {kind}")
