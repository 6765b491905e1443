"""What every engine behind asyncrl's server does the same way, whatever runs the model: take
requests from any thread, step on a thread of its own, run control operations (weight loads)
between two steps, pause and resume, and end everything on close.

An engine subclasses it and says where new sequences queue (`_enqueue`), which are in flight
(`_unfinished`), whether there is anything to step (`_has_steps`), how one step runs (`_step`)
and how a sequence ends (`_finish`).

An engine that computes with torch on the CPU (`borrows_cores`) runs on the trainer's core too
while the trainer waits for a batch, when the launcher lends it (`core_lending.py`).

A step that raises aborts the requests in flight and the engine goes on: one bad request costs
its sender. A step that fails `FAILED_STEPS_BEFORE_GIVING_UP` times in a row, with fresh
requests each time, is a broken engine (a library that changed under it, a device gone): it
then closes, records why in `failure` and calls `on_failure`, so the server reports itself
unhealthy and exits instead of aborting every request forever behind a green /health.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from asyncrl.core_lending import Borrower
from asyncrl.inference.sampling import SamplingParams
from asyncrl.inference.sequences import Request, Sequence
from asyncrl.log import get_logger
from asyncrl.types import PauseMode

logger = get_logger(__name__)

FAILED_STEPS_BEFORE_GIVING_UP = 5


class EngineThread:
    borrows_cores = False  # whether `_step` computes with torch threads a lent core can run

    def __init__(self, thread_name: str) -> None:
        self._ids = itertools.count()
        self._condition = threading.Condition()
        self._operations: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._held: list[Request] = []  # arrived while paused or draining
        self._paused = False
        self._draining = False
        self._stopped = False
        self._closed = False  # shutting down: every request, held or new, ends as aborted
        self._failed_steps = 0  # in a row
        self.failure: str | None = None  # why the engine gave up, once it has
        self.on_failure: Callable[[str], None] | None = None  # called once, on the engine thread
        self.borrower: Borrower | None = None  # made on the engine thread, whose threads it sets
        self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)

    # what an engine provides ---------------------------------------------------------------------
    def _new_sequence(self, request: Request, index: int) -> Sequence:
        return Sequence(request, index, None)

    def _enqueue(self, sequences: Iterable[Sequence]) -> None:
        """With the condition held: queue sequences to be run."""
        raise NotImplementedError

    def _unfinished(self) -> list[Sequence]:
        """With the condition held: every sequence queued or running, not yet finished."""
        raise NotImplementedError

    def _has_steps(self) -> bool:
        """With the condition held: whether `_step` has anything to do."""
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError

    def _finish(self, sequence: Sequence, reason: str) -> None:
        """With the condition held: end `sequence`, and its request once all of them ended."""
        raise NotImplementedError

    # public, thread-safe -------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> Request:
        request = Request(f"req-{next(self._ids)}", list(prompt_ids), params, n, Future())
        request.sequences.extend(self._new_sequence(request, index) for index in range(n))
        with self._condition:
            if self._closed:
                for sequence in request.sequences:
                    self._finish(sequence, "abort")
            elif self._paused or self._draining:
                self._held.append(request)
            else:
                self._enqueue(request.sequences)
            self._condition.notify_all()
        return request

    def abort(self, request: Request) -> None:
        with self._condition:
            for sequence in request.sequences:
                if sequence.finish_reason is None:
                    self._finish(sequence, "abort")
            self._condition.notify_all()

    def run_exclusive(self, operation: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run `operation` on the engine thread between two steps; returns its result."""
        future: Future[Any] = Future()
        with self._condition:
            self._operations.append((operation, future))
            self._condition.notify_all()
        return future.result(timeout=timeout)

    def pause(self, mode: PauseMode) -> None:
        """abort: end in-flight requests now; wait: let them finish; keep: freeze them in place.
        Returns once paused. Requests that arrive while paused wait for `resume`."""
        with self._condition:
            if mode == "abort":
                for sequence in self._unfinished():
                    self._finish(sequence, "abort")
            elif mode == "wait":
                self._draining = True
                self._condition.notify_all()
                self._condition.wait_for(lambda: not self._unfinished())
                self._draining = False
            self._paused = True
            self._condition.notify_all()

    def resume(self) -> None:
        with self._condition:
            self._paused = False
            for request in self._held:
                self._enqueue(s for s in request.sequences if s.finish_reason is None)
            self._held.clear()
            self._condition.notify_all()

    @property
    def is_paused(self) -> bool:
        return self._paused

    def close(self) -> None:
        """Abort everything in flight, held by a pause included, and every later request: the
        server can then shut down without waiting on requests that would never finish."""
        with self._condition:
            self._closed = True
            held = [s for request in self._held for s in request.sequences]
            self._held.clear()
            for sequence in [*self._unfinished(), *held]:
                if sequence.finish_reason is None:
                    self._finish(sequence, "abort")
            self._condition.notify_all()

    def shutdown(self) -> None:
        self.close()
        with self._condition:
            self._stopped = True
            self._condition.notify_all()
        self._thread.join(timeout=10)

    # the loop ------------------------------------------------------------------------------------
    @property
    def borrowing(self) -> bool:
        """Whether the step now running has a lent core beside the engine's own."""
        return self.borrower is not None and self.borrower.current > self.borrower.own

    def _loop(self) -> None:
        if self.borrows_cores:
            self.borrower = Borrower.from_environment()
        while True:
            with self._condition:
                self._condition.wait_for(self._has_work)
                if self._stopped:
                    return
                operations = list(self._operations)
                self._operations.clear()
            for operation, future in operations:
                try:
                    future.set_result(operation())
                except Exception as error:  # reported to the caller, the engine lives on
                    future.set_exception(error)
            self._borrow()
            try:
                self._step()
                self._failed_steps = 0
            except Exception as error:  # a failed step must not leave clients waiting forever
                logger.exception("engine step failed; aborting in-flight requests")
                self._failed_steps += 1
                if self._failed_steps == FAILED_STEPS_BEFORE_GIVING_UP:
                    self._give_up(error)  # before the aborts: a client told of one can ask why
                with self._condition:
                    for sequence in self._unfinished():
                        self._finish(sequence, "abort")

    def _borrow(self) -> None:
        """Take or give back a lent core before the step; a failure to do so ends borrowing,
        never a request."""
        if self.borrower is None:
            return
        try:
            self.borrower.before_step()
        except Exception:
            logger.exception("core lending failed; the engine stays on its own cores")
            self.borrower = None

    def _give_up(self, error: Exception) -> None:
        self.give_up(
            f"{FAILED_STEPS_BEFORE_GIVING_UP} engine steps in a row failed, the last with "
            f"{type(error).__name__}: {error}"
        )

    def give_up(self, reason: str) -> None:
        """Stop serving for good (on the engine thread): every request ends as aborted, the
        server reports `reason` on /health and its process exits, for a supervisor to
        restart it. For a failure that generating on would hide (weights it cannot trust)."""
        self.failure = reason
        logger.error("the engine gives up: %s", self.failure)
        if self.on_failure is not None:
            self.on_failure(self.failure)
        self.close()  # this request and every later one end at once as aborted

    def _has_work(self) -> bool:
        return self._stopped or bool(self._operations) or self._has_steps()
