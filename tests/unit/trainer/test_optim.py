from __future__ import annotations

import math
import sys

import pytest
import torch

from asyncrl.config.base import ConfigError
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.optim import build_optimizer, build_scheduler, lr_multiplier


def test_warmup_is_linear_up_to_the_peak() -> None:
    assert [lr_multiplier(s, 3, 10, "constant") for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_and_linear_decay_hand_worked() -> None:
    # warmup 2, total 10: decay over steps 2..10, progress = (step - 2) / 8
    assert lr_multiplier(2, 2, 10, "cosine") == 1.0
    assert lr_multiplier(6, 2, 10, "cosine") == pytest.approx(0.5)  # cos(pi/2)
    assert lr_multiplier(4, 2, 10, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_multiplier(10, 2, 10, "cosine") == pytest.approx(0.0)
    assert lr_multiplier(6, 2, 10, "linear") == pytest.approx(0.5)
    assert lr_multiplier(9, 2, 10, "linear") == pytest.approx(0.125)


def test_without_a_known_total_only_warmup_applies() -> None:
    assert lr_multiplier(100, 0, -1, "cosine") == 1.0


def test_scheduler_drives_the_optimizer_lr() -> None:
    model = torch.nn.Linear(2, 2)
    config = TrainerConfig(
        model="m",
        optimizer="adamw",
        learning_rate=0.1,
        warmup_steps=1,
        lr_scheduler_type="linear",
    )
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps=5)
    seen = []
    for _ in range(5):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.05, 0.1, 0.075, 0.05, 0.025])


def test_weight_decay_skips_biases_and_norms() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    optimizer = build_optimizer(model, TrainerConfig(model="m", optimizer="adamw"))
    decayed, plain = optimizer.param_groups
    assert [p.shape for p in decayed["params"]] == [torch.Size([3, 3])]
    assert len(plain["params"]) == 3 and plain["weight_decay"] == 0.0


def test_adamw_8bit_without_bitsandbytes_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import` fails as if not installed
    with pytest.raises(ConfigError, match="set `optimizer: adamw`"):
        build_optimizer(torch.nn.Linear(2, 2), TrainerConfig(model="m", optimizer="adamw_8bit"))


def test_default_optimizer_is_torch_adamw_which_needs_nothing_extra() -> None:
    optimizer = build_optimizer(torch.nn.Linear(2, 2), TrainerConfig(model="m"))
    assert type(optimizer) is torch.optim.AdamW
