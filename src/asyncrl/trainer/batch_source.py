"""Where the trainer's batches come from: rank 0 receives batch s from the orchestrator and
every rank gets it, under one deadline.

Rank 0 waits in slices. Between slices it lets its weight route act (admit a restarted server
to the NCCL/gloo group: the batch awaited may be one only that server can generate; or raise
when a colocated engine gave up, so no batch will come), and tells the other ranks it is still
waiting, so their wait never runs into the collective timeout
however slow the orchestrator is, while a dead rank still does. The batch travels to the other
ranks as its msgpack bytes in a uint8 tensor: typed decoding, nothing unpickled.
"""

from __future__ import annotations

import time

import msgspec
import torch
import torch.distributed as dist

from asyncrl.trainer.parallel import Ranks
from asyncrl.transport.rollout_transport import BatchReceiver
from asyncrl.transport.weights.route import WeightRoute
from asyncrl.types import TrainingBatch

HEARTBEAT = 30.0  # seconds rank 0 waits before telling the other ranks it still waits
_BATCH, _END, _WAITING = 0, 1, 2


class BatchSource:
    def __init__(
        self,
        receiver: BatchReceiver | None,
        route: WeightRoute | None,
        ranks: Ranks,
        timeout: float | None,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        """`receiver` and `route` exist on rank 0 only; `timeout` (None: none) bounds the wait
        for each batch, after which `next` raises TimeoutError. `route.waiting` runs between two
        slices of the wait (every `route.poll_seconds` at least) and may raise: the trainer
        stops then, not at the deadline."""
        self.receiver, self.route, self.ranks = receiver, route, ranks
        self.timeout = timeout
        poll = route.poll_seconds if route is not None else None
        self.slice = heartbeat if poll is None else min(heartbeat, poll)

    def next(self, step: int) -> TrainingBatch | None:
        """Batch `step` on every rank; None when the orchestrator has ended the run."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            state, batch = (
                self._one_slice(step, deadline) if self.ranks.is_main else (_WAITING, None)
            )
            if not self.ranks.distributed:
                if state != _WAITING:
                    return batch
                continue
            payload = msgspec.msgpack.encode(batch) if batch is not None else b""
            header = torch.tensor(
                [state, len(payload)], dtype=torch.int64, device=self.ranks.device
            )
            dist.broadcast(header, src=0)
            state, size = (int(value) for value in header)
            if state == _WAITING:
                continue
            if state == _END:
                return None
            return self._broadcast_payload(payload, size)

    def _one_slice(self, step: int, deadline: float | None) -> tuple[int, TrainingBatch | None]:
        """Rank 0 waits one slice: (BATCH, batch), (END, None), or (WAITING, None) when the
        slice ran out before the deadline; TimeoutError once the deadline has passed."""
        assert self.receiver is not None  # rank 0 has one
        if self.route is not None:
            self.route.waiting()
        left = None if deadline is None else deadline - time.monotonic()
        try:
            wait = self.slice if left is None else max(0.0, min(self.slice, left))
            batch = self.receiver.receive(step, timeout=wait)
        except TimeoutError:
            if left is not None and left <= self.slice:
                raise
            return _WAITING, None
        return (_END, None) if batch is None else (_BATCH, batch)

    def _broadcast_payload(self, payload: bytes, size: int) -> TrainingBatch:
        device = self.ranks.device
        if self.ranks.is_main:
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
        else:
            data = torch.empty(size, dtype=torch.uint8, device=device)
        dist.broadcast(data, src=0)
        return msgspec.msgpack.decode(data.cpu().numpy().tobytes(), type=TrainingBatch)
