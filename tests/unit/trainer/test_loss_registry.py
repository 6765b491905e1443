"""The loss registry: a user's loss by import path trains through the same micro-batch builder
and `compute_loss` as the built-ins, weighted by the normalisation it declares (checked against
sums written out by hand), and a path or key that would not work is refused when the config
loads, naming the key."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from asyncrl.config.base import ConfigError
from asyncrl.config.loading import load_config
from asyncrl.config.trainer import EVERY_LOSS_READS, LossConfig, TrainerConfig
from asyncrl.trainer.loss import (
    BUILT_IN,
    NORMALISATION,
    Loss,
    LossInputs,
    compute_loss,
    loss_named,
)
from asyncrl.trainer.micro_batches import MicroBatch
from asyncrl.trainer.parallel import SINGLE_PROCESS
from asyncrl.trainer.train import this_ranks_micro_batches
from asyncrl.types import TrainingBatch, TrainingSample

MODULE = "tests.unit.trainer.reinforce_loss"


def sample(completion: int, mask: list[bool], advantage: float) -> TrainingSample:
    return TrainingSample(
        prompt_ids=[1, 2], completion_ids=list(range(10, 10 + completion)),
        completion_mask=mask, inference_logprobs=[-0.1 * (i + 1) for i in range(completion)],
        advantages=[advantage] * completion, policy_versions=[0] * completion, temperature=1.0,
        env="e",
    )  # fmt: skip


BATCH = TrainingBatch(
    step=1,
    samples=[
        sample(3, [True, False, True], 1.5),  # 2 loss tokens
        sample(2, [True, True], -0.5),  # 2
        sample(1, [False], 2.0),  # none: not a sequence of the step
        sample(4, [True] * 4, 0.25),  # 4
    ],
    max_tokens=8,
)


def policy_logprob(inference_logprob: float) -> float:
    """The trainer's logprob of a token in these tests: close to, not equal to, the sampler's."""
    return 1.25 * inference_logprob - 0.05


def trained(config: TrainerConfig) -> tuple[float, list[float]]:
    """The step's loss, summed over one-row micro-batches, and the gradient with respect to each
    loss token's logprob (in micro-batch order)."""
    micro_batches: list[MicroBatch] = this_ranks_micro_batches(BATCH, config, SINGLE_PROCESS, 0)
    assert len(micro_batches) > 1  # the normalisation has to hold across micro-batches
    total, grads = 0.0, []
    for mb in micro_batches:
        logprobs = policy_logprob(mb.inference_logprobs.double()).requires_grad_(True)
        inputs = LossInputs(
            logprobs=logprobs, inference_logprobs=mb.inference_logprobs.double(),
            advantages=mb.advantages.double(), sequence_ids=mb.sequence_ids,
            token_weights=mb.token_weights.double(),
        )  # fmt: skip
        output = compute_loss(inputs, config.loss)
        output.loss.backward()
        total += output.loss.item()
        grads += logprobs.grad.tolist()
    return total, grads


def loss_tokens() -> list[tuple[int, float, float]]:
    """(sequence, advantage, trainer logprob) of every loss token of the batch."""
    return [
        (index, s.advantages[k], policy_logprob(s.inference_logprobs[k]))
        for index, s in enumerate(BATCH.samples)
        for k, keep in enumerate(s.completion_mask)
        if keep
    ]


def config_with(tmp_path: Path, loss_lines: str) -> TrainerConfig:
    path = tmp_path / "train.yaml"
    path.write_text(
        "model: m\nsequence_len: 8\nper_device_train_batch_size: 1\nloss:\n" + loss_lines
    )
    return load_config(TrainerConfig, [str(path)], [])


def test_a_plain_objective_by_import_path_takes_the_token_mean(tmp_path: Path) -> None:
    config = config_with(tmp_path, f"  type: {MODULE}:reinforce\n")
    loss, grads = trained(config)
    tokens = loss_tokens()
    # ℓ = Σ_t −A_t·lp_t / (loss tokens in the step): 8 tokens over three sequences
    assert loss == pytest.approx(sum(-a * lp for _, a, lp in tokens) / 8, abs=1e-6)
    assert sorted(grads) == pytest.approx(sorted(-a / 8 for _, a, _ in tokens), abs=1e-6)


@pytest.mark.parametrize("declared", ["SCALED_BY_SEQUENCE", "SCALED_SPEC"])
def test_a_loss_object_brings_its_normalisation_and_the_keys_it_reads(
    tmp_path: Path, declared: str
) -> None:
    """A `Loss`, or the torch-free `LossSpec` naming the same objective: the same step."""
    config = config_with(tmp_path, f"  type: {MODULE}:{declared}\n  adv_tau: 0.5\n")
    loss, grads = trained(config)
    tokens = loss_tokens()
    length = {i: sum(BATCH.samples[i].completion_mask) for i, _, _ in tokens}
    # ℓ = Σ_i Σ_t −adv_tau·A·lp / (|o_i| · 3 sequences)
    expected = sum(-0.5 * a * lp / (length[i] * 3) for i, a, lp in tokens)
    assert loss == pytest.approx(expected, abs=1e-6)
    expected_grads = [-0.5 * a / (length[i] * 3) for i, a, _ in tokens]
    assert sorted(grads) == pytest.approx(sorted(expected_grads), abs=1e-6)


@pytest.mark.parametrize(
    ("loss_type", "key", "says"),
    [
        (f"{MODULE}:reinforce", "beta",
         f"`beta` does nothing for loss `{MODULE}:reinforce`: it is read by cispo, dapo, "
         "dr_grpo, grpo_clip, gspo"),
        (f"{MODULE}:SCALED_BY_SEQUENCE", "kl_tau",
         f"`kl_tau` does nothing for loss `{MODULE}:SCALED_BY_SEQUENCE`: it is read by "
         "masked_is"),
    ],
)  # fmt: skip
def test_a_key_the_users_loss_does_not_read_is_refused(loss_type: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(TrainerConfig, [], ["--model", "m", "--loss.type", loss_type,
                                        f"--loss.{key}", "0.1"])  # fmt: skip


@pytest.mark.parametrize(
    ("loss_type", "says"),
    [
        ("ppo", "no loss `ppo`: one of 'masked_is', 'grpo_clip'"),
        ("no_such_package_for_losses.module:loss", "cannot import"),
        (f"{MODULE}:missing", "has no attribute 'missing'"),
        (f"{MODULE}:NOT_A_LOSS", "is not callable"),
    ],
)
def test_a_loss_path_that_does_not_resolve_names_the_key(loss_type: str, says: str) -> None:
    from asyncrl.config.rl import RLConfig

    with pytest.raises(ConfigError, match=r"`trainer\.loss\.type`: ") as error:
        load_config(RLConfig, [], ["--model", "m", "--trainer.loss.type", loss_type])
    assert says in str(error.value)


def test_a_loss_declaring_a_key_there_is_not_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"says it reads `epsilonn`: not `trainer\.loss` keys"):
        Loss("typo", loss_named("dapo").objective, reads=frozenset({"epsilon", "epsilonn"}))


def test_each_built_in_owns_its_normalisation() -> None:
    assert NORMALISATION == {
        "masked_is": "token", "grpo_clip": "sequence", "dr_grpo": "constant", "dapo": "token",
        "gspo": "sequence", "cispo": "token",
    }  # fmt: skip
    assert "dr_grpo_length" in loss_named("dr_grpo").keys_read  # through its normalisation
    assert "dr_grpo_length" not in loss_named("dapo").keys_read


def test_every_loss_key_is_read_by_a_built_in() -> None:
    """So the refusal of a key always names a loss that would read it; the terms added to
    every loss (the entropy bonus) are read whichever loss is chosen."""
    read = set().union(*(loss.keys_read for loss in BUILT_IN.values()))
    assert set(LossConfig.model_fields) - read == {"type"} | EVERY_LOSS_READS
    for name in BUILT_IN:
        LossConfig(type=name, entropy_coef=0.01)  # accepted by each


def test_a_users_loss_is_not_run_where_the_config_is_only_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher and `--print-config` validate `trainer.loss.type` without importing the
    user's module: a short-lived process imports it and says what it declares."""
    from asyncrl.config.rl import RLConfig

    ran = tmp_path / "imported"
    (tmp_path / "my_loss_module.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(ran)!r}).open('a').write('imported\\n')\n"
        f"from {MODULE} import SCALED_SPEC as LOSS\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    named = ["--model", "m", "--trainer.loss.type", "my_loss_module:LOSS"]
    config = load_config(RLConfig, [], [*named, "--trainer.loss.adv_tau", "2"])
    assert config.trainer.loss.adv_tau == 2  # the key it declares is accepted
    assert "my_loss_module" not in sys.modules
    assert ran.read_text() == "imported\n"  # once, in the checking process
    with pytest.raises(ConfigError, match="epsilon"):  # a key it does not read is refused
        load_config(RLConfig, [], [*named, "--trainer.loss.epsilon", "0.3"])
