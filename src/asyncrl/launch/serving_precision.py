"""The dtype the inference engine serves in under `asyncrl rl`, when the config says `auto`.

Alone, `asyncrl infer` serves a checkpoint in its own dtype. In a run, what matters is the
precision the trainer computes the policy in: with `recipe: bf16` (or `auto` on a device with
native bfloat16) every matmul of the trainer's forward pass is a bfloat16 one, and an engine
serving float32 weights pays for a precision the policy is not computed in. Served in bfloat16
the engine's decode step took 12.6 ms instead of 18.7 ms (32 rows, `small`, one core of an AMD
EPYC with AVX512-BF16), and its logprobs stayed as close to the trainer's (k3 KL 5e-5 to 1e-4
either way, benchmarks/RESULTS.md). So the launcher, which starts both on this machine, asks
the device the same question the trainer will (`precision.resolve_recipe`) and writes the
answer into the inference section; a dtype set in the config is left alone.
"""

from __future__ import annotations

from asyncrl.config.rl import RLConfig
from asyncrl.log import get_logger

logger = get_logger(__name__)


def serve_in_training_precision(config: RLConfig) -> RLConfig:
    """`inference.dtype: auto` becomes bfloat16 when the trainer will compute in bfloat16."""
    if config.inference.dtype != "auto" or config.inference.backend != "embedded":
        return config
    if config.trainer.recipe == "fp32":
        return config
    # torch (1.5 s to import) only when the device must be asked: the launcher needs it nowhere else
    from asyncrl.precision import resolve_recipe

    choice = resolve_recipe(config.trainer.recipe)
    if choice.recipe != "bf16":
        return config
    logger.info("rl: the engine serves in bfloat16, the trainer's precision (%s)", choice.reason)
    inference = config.inference.model_copy(update={"dtype": "bfloat16"})
    trainer = config.trainer
    if trainer.colocated_inference is not None:
        colocated = trainer.colocated_inference.model_copy(update={"dtype": "bfloat16"})
        trainer = trainer.model_copy(update={"colocated_inference": colocated})
    return config.model_copy(update={"inference": inference, "trainer": trainer})
