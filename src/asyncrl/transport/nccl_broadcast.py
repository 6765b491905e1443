"""Weight broadcast over torch.distributed: NCCL on GPUs, gloo on CPU (so it runs in tests here).

The trainer is rank 0 and hosts the rendezvous store; each inference server is one more rank.
For its n-th send in a group the trainer sets the store key `manifest_<n>` (a checksum per
tensor, `weights/manifest.py`) and then `send_<n>`, then broadcasts a header (step, tensor
count) and every parameter in `named_parameters()` order — the receivers hold the same
architecture, so order and shapes agree. Tensors go at the servers' dtype (`dtype_<n>` says
which), or, as a delta from the version every member received last, as one compressed blob per
changed tensor (`delta_<n>` lists their sizes; after a group is formed the next send is full).
A receiver checks what arrived against the manifest before anything is installed: a torn or
corrupted transfer is never served. Receivers wait for
that key in short polls, so a long training step is never mistaken for a dead peer; the
transfer itself is bounded by `timeout` and raises instead of hanging.

A group outlives the loss of any member. When a server dies the trainer's next send fails; a
restarted server finds the group `complete` without it and asks to rejoin. Either way the
trainer dissolves the group (closing its store tells every live server), forms a new one on the
same port once every server is back (at most `timeout` seconds), and sends its current weights.
When the trainer dies, the servers keep serving and wait for the restarted trainer's group.

Full weights only: a LoRA policy broadcasts its adapter through the filesystem.

The store has no authentication, so it listens on the configured host only (torch's own server
would listen on every interface): loopback by default, the trainer's address on a cluster.
There every key the group uses lives under a prefix derived from the run's secret
(`run_secret.py`), and a role without the secret refuses a host off loopback: a client of the
store that lacks the secret cannot ask for a rebuild, announce a send or take a rank, since
it cannot name any of those keys. (The weights themselves travel over NCCL or gloo
connections, which only the group's members make.)
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from asyncrl.log import get_logger
from asyncrl.run_secret import secret_for, store_prefix
from asyncrl.transport.fingerprint import version_checksum
from asyncrl.transport.weights.delta import (
    DeltaPolicy,
    Written,
    default_codec,
    delta_bytes,
    encode_delta,
    full_bytes,
)
from asyncrl.transport.weights.manifest import DeltaBase, Manifest, dtype_name, make_manifest
from asyncrl.waiting import Wait

logger = get_logger(__name__)

COMPLETE = "complete"  # set by the trainer once every server has joined
REJOIN = "rejoin"  # a counter: restarted servers that found the group complete without them
CONNECT_TIMEOUT = 5.0  # one attempt to reach the trainer's store; a server keeps trying
CHANNEL = "the weight-broadcast store (weight_broadcast: nccl)"
CODEC = default_codec()
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _keys_of_this_run(host: str) -> str:
    """The prefix under which the group's keys live (the run's secret in it when there is one)."""
    return store_prefix(secret_for(CHANNEL, host), "weight-broadcast")


def _backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _init_group(store: dist.Store, rank: int, world_size: int, timeout: float) -> None:
    if _backend() == "nccl":  # abort the communicator and raise here, not tear the process down
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    dist.init_process_group(
        _backend(), store=store, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )  # fmt: skip


def _leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass(frozen=True)
class Outgoing:
    """A version as it goes out: its manifest, the tensors at the served dtype (in the order of
    `named_parameters()`), and, when it goes as a delta, the manifest naming its base and the
    compressed XOR of each changed tensor."""

    step: int
    manifest: Manifest
    served: dict[str, torch.Tensor]
    delta: tuple[Manifest, dict[str, bytes]] | None = None

    @property
    def full(self) -> Outgoing:
        return Outgoing(self.step, self.manifest, self.served)


class WeightSender:
    """Rank 0: the trainer. `send` after each step; `admit_restarted_servers` while it waits.

    Weights go at `served_dtype` (the servers' dtype; None: the trainer's). With `delta` a
    version goes as what changed since the one before (`weights/delta.py`) when every member
    of the group received that one: after the group is formed (again), the next goes full."""

    def __init__(
        self,
        host: str,
        port: int,
        receivers: int,
        timeout: float,
        served_dtype: torch.dtype | None = None,
        delta: DeltaPolicy | None = None,
    ) -> None:
        self.host, self.port, self.receivers, self.timeout = host, port, receivers, timeout
        self.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self.served_dtype, self.delta_policy = served_dtype, delta
        self.outgoing: Outgoing | None = None  # the version last sent: resent to a new group
        self.base: Written | None = None  # the version every member holds, for a delta
        self.sizes: dict[str, float] = {}  # of the version last sent
        self.prefix = _keys_of_this_run(host)
        self._form_group()

    def _form_group(self) -> None:
        """Host the store on `host` only, and wait (at most `timeout`) for every server."""
        logger.info(
            "weight broadcast: waiting for %d inference rank(s) on %s:%d",
            self.receivers, self.host, self.port,
        )  # fmt: skip
        listener = socket.create_server((self.host, self.port))
        server = dist.TCPStore(
            self.host, self.port, self.receivers + 1, is_master=True,
            timeout=timedelta(seconds=self.timeout), master_listen_fd=listener.fileno(),
        )  # fmt: skip
        listener.detach()  # the store owns the socket now, and closes it with itself
        self.store: dist.Store | None = dist.PrefixStore(self.prefix, server)
        _init_group(self.store, 0, self.receivers + 1, self.timeout)
        self.store.set(COMPLETE, "1")
        self.sends = 0
        self.base = None  # a member may be new: it holds its own weights

    def _rebuild(self, why: str) -> None:
        logger.warning(
            "weight broadcast: %s; forming the group again (up to %.0f s for every server)",
            why, self.timeout,
        )  # fmt: skip
        _leave_group()
        self.store = None  # the last reference: its server closes, which tells the live servers
        self._form_group()

    def _restarted_servers(self) -> int:
        assert self.store is not None
        return int(self.store.add(REJOIN, 0))

    @torch.no_grad()
    def send(self, step: int, model: torch.nn.Module) -> Manifest:
        """Weights version `step` to every server, and its manifest; a group that lost a member
        is formed again and sent to once more, in full (a second failure raises)."""
        if hasattr(model, "peft_config"):
            raise ValueError(
                "NCCL broadcast sends full weights; use filesystem broadcast with LoRA"
            )
        if self._restarted_servers():
            self._rebuild("a restarted server asks to rejoin")
        self.outgoing = self._outgoing(step, model)
        failure = None
        try:
            self._send(self.outgoing)
        except RuntimeError as error:  # gloo: a peer's socket closed; NCCL: the aborted comm
            failure = str(error)  # not the error itself: it keeps the old group (and port)
        if failure is not None:
            self._rebuild(f"sending weights version {step} failed ({failure})")
            self._send(self.outgoing.full)
        if self.delta_policy is not None and self.delta_policy.wanted:
            served = self.outgoing.served
            manifest = self.outgoing.manifest
            checksums = manifest.checksums_at(self._sent_dtype(served)) or manifest.stored
            own = {name: tensor.detach().to("cpu", copy=True) for name, tensor in served.items()}
            self.base = Written(step, own, version_checksum(checksums))
        return self.outgoing.manifest

    def _outgoing(self, step: int, model: torch.nn.Module) -> Outgoing:
        """The version's manifest and tensors at the served dtype, and its delta from the
        version every member holds when one is wanted and pays."""
        parameters = {name: p.detach() for name, p in model.named_parameters()}
        manifest, served = make_manifest(step, parameters, self.served_dtype)
        outgoing = Outgoing(step, manifest, dict(served))
        policy, base = self.delta_policy, self.base
        self.sizes = {"trainer/weights_full_bytes": float(full_bytes(served))}
        if policy is None or not policy.wanted or base is None:
            return outgoing
        blobs = encode_delta(base.served, {n: t.to("cpu") for n, t in served.items()}, CODEC)
        size = delta_bytes(blobs)
        self.sizes["trainer/weights_delta_bytes"] = float(size)
        if not policy.pays(size, full_bytes(served)):
            return outgoing
        sent = dtype_name(self._sent_dtype(served))
        named_base = DeltaBase(base.step, base.checksum, sent, CODEC, "nccl")
        return Outgoing(step, manifest, dict(served), (replace(manifest, delta=named_base), blobs))

    @staticmethod
    def _sent_dtype(served: dict[str, torch.Tensor]) -> torch.dtype:
        return next(t.dtype for t in served.values() if t.is_floating_point())

    def admit_restarted_servers(self) -> None:
        """Between steps: let a restarted server back in and send it the current weights, so a
        run whose only server restarted never waits for a batch that server must make."""
        if self.store is not None and self._restarted_servers():
            self._rebuild("a restarted server asks to rejoin")
            if self.outgoing is not None:
                self._send(self.outgoing.full)

    def _send(self, outgoing: Outgoing) -> None:
        """The keys first (manifest, dtype sent, and a delta's blob sizes), then the header
        (step, tensor count), then each tensor or blob."""
        assert self.store is not None
        self.sends += 1
        n = self.sends
        manifest = outgoing.delta[0] if outgoing.delta else outgoing.manifest
        self.store.set(f"manifest_{n}", manifest.to_json())
        self.store.set(f"dtype_{n}", dtype_name(self._sent_dtype(outgoing.served)))
        if outgoing.delta is not None:
            blobs = outgoing.delta[1]
            self.store.set(f"delta_{n}", json.dumps([[k, len(v)] for k, v in blobs.items()]))
            tensors = {
                name: torch.frombuffer(bytearray(blob), dtype=torch.uint8)
                for name, blob in blobs.items()
            }
        else:
            tensors = outgoing.served
        self.store.set(f"send_{n}", str(outgoing.step))
        header = torch.tensor([outgoing.step, len(tensors)], dtype=torch.int64, device=self.device)
        dist.broadcast(header, src=0)
        for name, tensor in tensors.items():
            self._broadcast(name, tensor.to(self.device).contiguous())

    def _broadcast(self, name: str, tensor: torch.Tensor) -> None:
        """One tensor to every receiver (a seam where tests tear a transfer)."""
        dist.broadcast(tensor, src=0)

    def close(self) -> None:
        _leave_group()
        self.store = None


@dataclass(frozen=True)
class Received:
    """A version as a server received it: staging copies of every tensor (in the dtype sent),
    or a delta's blobs, and the trainer's manifest (None from a trainer that sends none)."""

    step: int
    tensors: dict[str, torch.Tensor] | None
    blobs: dict[str, bytes] | None
    manifest: Manifest | None


class WeightReceiver:
    """Rank >= 1: an inference server. `receive` blocks until the trainer sends a step; it joins
    (and, after losing the trainer, rejoins) the trainer's group by itself."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout: float) -> None:
        self.host, self.port, self.rank = host, port, rank
        self.world_size, self.timeout = world_size, timeout
        self.prefix = _keys_of_this_run(host)
        self.store: dist.Store | None = None
        self.sends = 0

    @torch.no_grad()
    def receive(
        self, model: torch.nn.Module, should_stop: Callable[[], bool], poll: float = 1.0
    ) -> Received | None:
        """The next version received (None if told to stop while waiting)."""
        while not should_stop():
            if self.store is None:
                self._join(should_stop, poll)
                continue
            try:  # `check`, not a timed `wait`: torch logs a warning for every wait that times out
                sent = self.store.check([f"send_{self.sends + 1}"])
                received = self._receive_tensors(model) if sent else None
            except RuntimeError as error:  # the store closed: the trainer died or re-forms
                failure = str(error)  # not the error: it would keep the old group alive
            else:
                if received is None:
                    time.sleep(poll)
                    continue
                self.sends += 1
                return received
            self._leave(f"lost the trainer's weight group ({failure})")
        return None

    def _join(self, should_stop: Callable[[], bool], poll: float) -> None:
        """Join the trainer's next group. A group already complete formed without this server
        (it restarted): ask to rejoin, then wait for that group's store to close."""
        wait = Wait(
            f"the trainer's weight group on {self.host}:{self.port}", logger,
            first_report_after=30.0,
        )  # fmt: skip
        while not should_stop():
            try:
                store = self._connect()
            except (OSError, RuntimeError):  # nobody listens yet (the trainer starts, restarts)
                wait.check()
                time.sleep(poll)
                continue
            try:
                if store.check([COMPLETE]):
                    store.add(REJOIN, 1)
                    logger.info("weight broadcast: asked the trainer to let rank %d in", self.rank)
                    _wait_until_closed(store, should_stop, poll)
                    continue
                store.set_timeout(timedelta(seconds=self.timeout))
                _init_group(store, self.rank, self.world_size, self.timeout)
            except RuntimeError as error:  # the trainer went away while the group formed
                logger.warning("weight broadcast: joining failed (%s); trying again", error)
                _leave_group()
                continue
            self.store, self.sends = store, 0
            logger.info("joined the weight broadcast group as rank %d", self.rank)
            return

    def _connect(self) -> dist.Store:
        """A client of the trainer's store, seeing this run's keys only. A plain connection is
        tried first: torch logs every failed attempt of its own, which would flood the log
        while the trainer restarts."""
        socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT).close()
        client = dist.TCPStore(
            self.host, self.port, self.world_size, is_master=False,
            timeout=timedelta(seconds=CONNECT_TIMEOUT),
        )  # fmt: skip
        return dist.PrefixStore(self.prefix, client)

    def ask_again(self, why: str) -> None:
        """What arrived did not check: leave the group and ask to be let back in; the trainer
        forms it again and sends its current weights (`admit_restarted_servers`)."""
        self._leave(why)

    def _receive_tensors(self, model: torch.nn.Module) -> Received:
        """The next version: the keys the trainer set before it (manifest, dtype sent, a
        delta's blob sizes), then the header and every tensor or blob."""
        assert self.store is not None
        n = self.sends + 1
        manifest = sizes = None
        dtype: torch.dtype | None = None
        if self.store.check([f"manifest_{n}"]):  # a trainer from before manifests sets none
            raw = self.store.get(f"manifest_{n}")
            manifest = Manifest.from_json(raw, f"the trainer's manifest_{n}")
            dtype = DTYPES.get(self.store.get(f"dtype_{n}").decode())
            if manifest.delta is not None:
                sizes = [(str(k), int(v)) for k, v in json.loads(self.store.get(f"delta_{n}"))]
        device = next(model.parameters()).device  # NCCL needs GPU tensors, gloo CPU ones
        header = torch.zeros(2, dtype=torch.int64, device=device)
        dist.broadcast(header, src=0)
        step, count = (int(v) for v in header)
        if sizes is not None:
            blobs = {}
            for name, size in sizes:
                buffer = torch.empty(size, dtype=torch.uint8, device=device)
                dist.broadcast(buffer, src=0)
                blobs[name] = buffer.cpu().numpy().tobytes()
            return Received(step, None, blobs, manifest)
        parameters = list(model.named_parameters())
        if count != len(parameters):
            raise ValueError(f"trainer sends {count} tensors, this model has {len(parameters)}")
        staged = {}
        for name, parameter in parameters:
            # contiguous, as sent (in the dtype sent): its own layout may differ (`input_major.py`)
            buffer = torch.empty(parameter.shape, dtype=dtype or parameter.dtype, device=device)
            dist.broadcast(buffer, src=0)
            staged[name] = buffer
        return Received(step, staged, None, manifest)

    def _leave(self, why: str) -> None:
        logger.warning("weight broadcast: %s; waiting for the trainer's next group", why)
        _leave_group()
        self.store = None

    def close(self) -> None:
        _leave_group()
        self.store = None


def _wait_until_closed(store: dist.Store, should_stop: Callable[[], bool], poll: float) -> None:
    while not should_stop():
        try:
            store.check([COMPLETE])
        except RuntimeError:
            return
        time.sleep(poll)
