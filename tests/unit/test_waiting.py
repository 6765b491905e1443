from __future__ import annotations

import logging
import time

import pytest

from asyncrl.waiting import Wait


def test_reports_at_once_then_every_period(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("asyncrl.test_waiting")
    logger.propagate = True
    wait = Wait("the thing", logger, every=0.05)
    with caplog.at_level(logging.INFO, logger="asyncrl.test_waiting"):
        for _ in range(4):
            wait.check()  # checks well inside one period: one report
        time.sleep(0.06)
        wait.check()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("waiting for the thing" in m for m in messages)


def test_gives_up_naming_what_it_waited_for() -> None:
    wait = Wait("weights version 3", logging.getLogger("asyncrl.test_waiting"), timeout=0.01)
    time.sleep(0.02)
    with pytest.raises(TimeoutError, match="gave up waiting for weights version 3 after 0 s"):
        wait.check()
