"""Which losses exist, as the configuration knows them: each built-in's objective (by import
path), its normalisation (by name) and the `trainer.loss` keys it reads — one entry per loss,
and nothing about a loss decided anywhere else. Torch-free, so a config validates without
loading the trainer; the trainer resolves an entry to its functions (`trainer/loss.py`).

`loss.type` names a built-in or a user's loss by import path, `package.module:name`, imported
only because the user wrote it: a `LossSpec`, the trainer's `Loss` (both say their
normalisation and keys), or a plain objective `(LossInputs, LossConfig) -> LossOutput`, which
takes the token mean and reads no key (docs/training.md, Writing a loss).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config import import_path
from asyncrl.config.base import ConfigError
from asyncrl.config.import_path import load_object

NormalisationName = Literal["token", "sequence", "constant"]
# the `trainer.loss` keys a normalisation reads (they count as read by every loss using it)
NORMALISATION_READS: dict[str, frozenset[str]] = {
    "token": frozenset(),
    "sequence": frozenset(),
    "constant": frozenset({"dr_grpo_length"}),
}


@dataclass(frozen=True)
class LossSpec:
    """A loss: `objective` (import path) computes one micro-batch's share of the step's loss
    from tokens already weighted by `normalisation`; `reads` are the `trainer.loss` keys the
    objective looks at (`type` aside). A key outside `keys_read` that a config sets away from
    its default is refused when the config loads, so a setting never silently does nothing.
    `silent_when_zero`: the keys that, all 0, make a token whose advantage is 0 add exactly 0
    to the loss and its gradient (its KL coefficients), so that the trainer need not compute a
    sample whose advantages are all 0 (`trainer/zero_advantage.py`); None, the default, says
    nothing and every sample is computed."""

    name: str
    objective: str
    normalisation: NormalisationName = "token"
    reads: frozenset[str] = field(default_factory=frozenset)
    silent_when_zero: frozenset[str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads", frozenset(self.reads))  # a set or tuple will do
        if self.silent_when_zero is not None:
            object.__setattr__(self, "silent_when_zero", frozenset(self.silent_when_zero))
        if self.normalisation not in NORMALISATION_READS:
            raise ConfigError(
                f"loss `{self.name}`: normalisation `{self.normalisation}` is not one of "
                f"{', '.join(NORMALISATION_READS)}"
            )

    @property
    def keys_read(self) -> frozenset[str]:
        """Every key this loss reads: its objective's and its normalisation's."""
        return self.reads | NORMALISATION_READS[self.normalisation]


OBJECTIVES = "asyncrl.trainer.objectives"
MASKED_IS_KEYS = frozenset({
    "ratio_type", "kl_tau", "adv_tau", "teacher_tau", "token_mask_low", "token_mask_high",
    "geo_mask_low", "geo_mask_high", "sequence_mask_low", "sequence_mask_high",
    "sequence_clip_high",
})  # fmt: skip
CLIPPED_KEYS = frozenset({"epsilon", "epsilon_high", "beta", "kl_estimator"})
# the clipped token losses also say what their ratio is against (gspo's is per sequence: its own)
PROXIMAL_KEYS = CLIPPED_KEYS | {"clip_against", "behaviour_weight_cap"}
BETA = frozenset({"beta"})

BUILT_IN: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        # masked_is: importance · (adv_tau · A − kl_tau · log ratio), teacher_tau not built;
        # the others: a multiple of A, plus β · KL to the reference (objectives.py)
        LossSpec(
            "masked_is",
            f"{OBJECTIVES}:masked_is_loss",
            "token",
            MASKED_IS_KEYS,
            frozenset({"kl_tau", "teacher_tau"}),
        ),
        LossSpec("grpo_clip", f"{OBJECTIVES}:clipped_loss", "sequence", PROXIMAL_KEYS, BETA),
        LossSpec("dr_grpo", f"{OBJECTIVES}:clipped_loss", "constant", PROXIMAL_KEYS, BETA),
        LossSpec("dapo", f"{OBJECTIVES}:clipped_loss", "token", PROXIMAL_KEYS, BETA),
        LossSpec("gspo", f"{OBJECTIVES}:gspo_loss", "sequence", CLIPPED_KEYS, BETA),
        LossSpec("cispo", f"{OBJECTIVES}:cispo_loss", "token", CLIPPED_KEYS, BETA),
    )
}


@functools.cache
def loss_spec(name: str) -> LossSpec:
    """The loss `loss.type` names: a built-in, or by import path a `LossSpec`, a `Loss` (read
    through its `normalisation.name` and `reads`), or a plain objective. Anything else is a
    ConfigError that says what would do. A user's module is imported here only in a process
    that runs user code anyway (the trainer, `user_code_runs_here`); elsewhere (the launcher,
    `--print-config`, the orchestrator) a short-lived process imports it and describes it."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    if ":" not in name and "." not in name:
        raise ConfigError(
            f"no loss `{name}`: one of {', '.join(repr(known) for known in BUILT_IN)}, or your "
            "own by import path, `package.module:name` (docs/training.md, Writing a loss)"
        )
    if not import_path.user_code_is_here():
        said = import_path.run_elsewhere(_DESCRIBE, name, "trainer.loss.type")
        try:
            return LossSpec(**json.loads(said))
        except (ValueError, TypeError):  # the module printed something else, or exited early
            raise ConfigError(
                f"`trainer.loss.type: {name}`: the process that imported it to check it said "
                f"{said[:300]!r}, not what the loss declares"
            ) from None
    return LossSpec(**describe(load_object(name), name))


def describe(found: object, name: str) -> dict[str, object]:
    """A user's loss object as the fields of its `LossSpec` (see `loss_spec`)."""
    if isinstance(found, LossSpec):
        silent = found.silent_when_zero
        return {"name": found.name, "objective": found.objective,
                "normalisation": found.normalisation, "reads": sorted(found.reads),
                "silent_when_zero": None if silent is None else sorted(silent)}  # fmt: skip
    normalisation = getattr(getattr(found, "normalisation", None), "name", None)
    if normalisation is not None and hasattr(found, "reads"):  # the trainer's `Loss`
        return {"name": str(getattr(found, "name", name)), "objective": name,
                "normalisation": normalisation, "reads": sorted(found.reads)}  # fmt: skip
    if not callable(found):
        raise ConfigError(f"`{name}` is not callable: name a `LossSpec`, a `Loss` or an objective")
    return {"name": name, "objective": name}


_DESCRIBE = """
import json, sys
from asyncrl.config.base import ConfigError
from asyncrl.config import import_path
from asyncrl.config.import_path import load_object
from asyncrl.config.losses import describe
try:
    print(json.dumps(describe(load_object(sys.argv[1]), sys.argv[1])))
except ConfigError as error:
    print(" ".join(str(error).split())[:2000])
    sys.exit(3)
"""


def readers_of(key: str) -> list[str]:
    """The built-in losses that read `key`, for an error that says which one to choose."""
    return [name for name, spec in BUILT_IN.items() if key in spec.keys_read]
