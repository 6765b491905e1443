"""An engine whose steps keep failing gives up instead of aborting requests forever: after
`FAILED_STEPS_BEFORE_GIVING_UP` failed steps in a row it records why, says so once, and ends
every later request at once; one failed step among good ones costs only its own requests.

The failure is injected (the model's forward replaced by one that raises, as transformers 5.24's
attention did with the old KV cache): no real fault is known now that fails every step."""

from __future__ import annotations

import pytest

from asyncrl.inference.engine import Engine
from asyncrl.inference.engine_thread import FAILED_STEPS_BEFORE_GIVING_UP
from asyncrl.inference.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


class InjectedFault:
    """The model's forward, raising while `failing` is set."""

    def __init__(self, engine: Engine) -> None:
        self.real_forward, self.failing = engine.model.forward, True

    def __call__(self, *args: object, **kwargs: object) -> object:
        if self.failing:
            raise TypeError("injected: update() got an unexpected keyword argument 'kwargs'")
        return self.real_forward(*args, **kwargs)


def finish(engine: Engine) -> str | None:
    return engine.submit([70, 71], PARAMS).done.result(timeout=60)[0].finish_reason


def test_steps_failing_in_a_row_make_the_engine_give_up_once(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[str] = []
    engine.on_failure = told.append
    monkeypatch.setattr(engine.model, "forward", InjectedFault(engine))
    for _ in range(FAILED_STEPS_BEFORE_GIVING_UP - 1):
        assert finish(engine) == "abort"
        assert engine.failure is None  # not yet: a few bad steps may be a few bad requests
    assert finish(engine) == "abort"
    assert engine.failure is not None and "TypeError: injected" in engine.failure
    assert told == [engine.failure]
    assert finish(engine) == "abort"  # ended at once, without a step
    assert len(told) == 1


def test_a_good_step_between_failures_starts_the_count_again(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = InjectedFault(engine)
    monkeypatch.setattr(engine.model, "forward", fault)
    for _ in range(2):
        for _ in range(FAILED_STEPS_BEFORE_GIVING_UP - 1):
            assert finish(engine) == "abort"
        fault.failing = False
        assert finish(engine) == "length"
        fault.failing = True
    assert engine.failure is None
