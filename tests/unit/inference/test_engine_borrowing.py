"""The embedded engine runs on a lent core while the trainer's flag exists (`core_lending.py`):
its steps are counted as borrowed then and only then, and a greedy answer is the same token for
token as an engine that borrows nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.core_lending import LEND_FLAG_ENV, LENT_CPUS_ENV
from asyncrl.cpu_affinity import usable_cores
from asyncrl.inference.engine import Engine
from asyncrl.inference.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=0)
PROMPTS = [[70 + i, 71, 72 + i] for i in range(6)]

pytestmark = pytest.mark.skipif(
    len(usable_cores()) < 2 or not hasattr(os, "sched_setaffinity"),
    reason="needs two cores and Linux's thread affinity",
)


def answers(model_dir: Path) -> tuple[list[list[int]], list[list[float]], float, float]:
    """Token ids and logprobs of the prompts, answered together, with the engine's busy and
    borrowed seconds."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = Engine(model, AutoTokenizer.from_pretrained(model_dir), max_num_seqs=8,
                    max_model_len=128)  # fmt: skip
    try:
        requests = [engine.submit(prompt, GREEDY) for prompt in PROMPTS]
        outputs = [request.done.result(timeout=120)[0] for request in requests]
    finally:
        engine.shutdown()
    return ([o.token_ids for o in outputs], [o.logprobs for o in outputs],
            engine.stats.busy_seconds, engine.stats.borrowed_seconds)  # fmt: skip


def test_steps_borrow_exactly_while_the_flag_exists_and_answer_the_same(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "trainer_waiting"
    monkeypatch.setenv(LEND_FLAG_ENV, str(flag))
    monkeypatch.setenv(LENT_CPUS_ENV, str(usable_cores()[0]))
    alone_ids, alone_logprobs, busy, borrowed = answers(tiny_model_dir)
    assert busy > 0 and borrowed == 0.0  # no flag: nothing lent
    flag.touch()
    lent_ids, lent_logprobs, busy, borrowed = answers(tiny_model_dir)
    assert borrowed == pytest.approx(busy)  # every step ran with the lent core
    assert lent_ids == alone_ids
    for ours, theirs in zip(lent_logprobs, alone_logprobs, strict=True):
        assert len(ours) == GREEDY.max_tokens
        assert ours == pytest.approx(theirs, abs=1e-5)
