"""Waiting for another process, out loud: say what we wait for at once and every 30 s, and give
up with TimeoutError after `timeout` seconds, the message naming what was waited for and the
config key that sets the deadline (`key`), so a user knows what did not come and what to
raise. Every wait in asyncrl has a deadline by default; None (as long as it takes) is left
for a caller whose own deadline bounds it."""

from __future__ import annotations

import logging
import time


class Wait:
    """Call `check()` once per poll of a waiting loop."""

    def __init__(
        self,
        what: str,
        logger: logging.Logger,
        timeout: float | None = None,
        every: float = 30.0,
        first_report_after: float = 0.0,
        key: str | None = None,
    ) -> None:
        self.what, self.logger, self.timeout, self.every = what, logger, timeout, every
        self.key = key
        self.started = time.monotonic()
        self.next_report = self.started + first_report_after

    def check(self) -> None:
        now = time.monotonic()
        waited = now - self.started
        if self.timeout is not None and waited > self.timeout:
            setting = f" (the deadline is `{self.key}`)" if self.key else ""
            raise TimeoutError(
                f"gave up waiting for {self.what} after {self.timeout:.0f} s{setting}"
            )
        if now >= self.next_report:
            self.logger.info("waiting for %s (%.0f s so far)", self.what, waited)
            self.next_report = now + self.every
