"""What one training step measured, summed or maximised over the trainer's ranks."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from asyncrl.trainer.loss import LossOutput
from asyncrl.trainer.micro_batches import MicroBatch
from asyncrl.trainer.parallel import (
    Ranks,
    gather_per_rank,
    peak_memory_bytes,
    reduce_max,
    reduce_sums,
)
from asyncrl.types import TrainingBatch


@dataclass
class StepStats:
    loss: float = 0.0
    grad_norm: float = 0.0
    loss_tokens: int = 0
    masked_tokens: int = 0
    clipped_tokens: int = 0
    skipped_updates: int = 0
    empty_steps: int = 0  # steps with no token to train anywhere: nothing to update
    kl_sum: float = 0.0
    # k3 estimate of KL(π_before ‖ π) summed over the loss tokens: how far this batch's earlier
    # updates moved the policy before its last one (`num_iterations` > 1; 0 with one update)
    update_kl_sum: float = 0.0
    entropy_sum: float = 0.0
    tokens: int = 0
    step_time: float = 0.0
    lr: float = 0.0
    entropy_coef: float = 0.0  # the entropy bonus's weight this step (`loss.entropy_target`)
    version: int = 0  # weights version the batch is trained from (step - 1)
    max_staleness: int = 0  # versions between that and the oldest token's policy
    peak_memory: dict[int, float] = field(default_factory=dict)  # rank -> bytes
    rank_step_time: dict[int, float] = field(default_factory=dict)  # rank -> seconds

    def mismatch_kl(self) -> float:
        return self.kl_sum / max(1, self.loss_tokens)

    def summary(self) -> dict[str, float]:
        tokens = max(1, self.loss_tokens)
        per_rank = {f"rank_{r}/peak_memory_bytes": v for r, v in self.peak_memory.items()}
        per_rank |= {f"rank_{r}/step_time": v for r, v in self.rank_step_time.items()}
        return {
            "loss": self.loss,
            "grad_norm": self.grad_norm,
            "mismatch_kl": self.mismatch_kl(),
            "entropy": self.entropy_sum / tokens,
            "masked_fraction": self.masked_tokens / tokens,
            "clip_fraction": self.clipped_tokens / tokens,
            "update_kl": self.update_kl_sum / tokens,
            "loss_tokens": self.loss_tokens,
            "skipped_updates": self.skipped_updates,
            "empty_steps": self.empty_steps,
            "lr": self.lr,
            "entropy_coef": self.entropy_coef,
            "step_time": self.step_time,
            "tokens_per_s": self.tokens / max(self.step_time, 1e-9),
            "max_staleness": self.max_staleness,
            **per_rank,
        }

    def reduce(self, ranks: Ranks) -> None:
        """Sums and maxima over ranks, and each rank's peak memory and step time."""
        names = ["loss_tokens", "masked_tokens", "clipped_tokens", "kl_sum", "update_kl_sum",
                 "entropy_sum", "tokens"]  # fmt: skip
        sums = reduce_sums({name: float(getattr(self, name)) for name in names}, ranks)
        for name in ("loss_tokens", "masked_tokens", "clipped_tokens", "tokens"):
            setattr(self, name, int(sums[name]))
        self.kl_sum, self.entropy_sum = sums["kl_sum"], sums["entropy_sum"]
        self.update_kl_sum = sums["update_kl_sum"]
        own = {"step_time": self.step_time, "peak_memory": peak_memory_bytes(ranks.device)}
        gathered = gather_per_rank(own, ranks)
        self.rank_step_time = dict(enumerate(gathered["step_time"]))
        self.peak_memory = dict(enumerate(gathered["peak_memory"]))
        maxima = reduce_max({"step_time": self.step_time, "staleness": self.max_staleness}, ranks)
        self.step_time, self.max_staleness = maxima["step_time"], int(maxima["staleness"])


def record_first_pass(
    stats: StepStats,
    mb: MicroBatch,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    output: LossOutput,
) -> None:
    """Metrics of the policy the batch was sampled against (before this step's updates)."""
    log_ratio = logprobs - mb.inference_logprobs  # log(π_train / π_inf) on sampled tokens
    finite = torch.isfinite(log_ratio)
    # k3 estimate of KL(π_inf || π_train): E[r − 1 − log r], r = π_train / π_inf
    stats.kl_sum += float((torch.exp(log_ratio) - 1 - log_ratio)[finite].sum())
    stats.entropy_sum += float(entropy.sum())
    stats.loss_tokens += mb.num_loss_tokens
    stats.masked_tokens += output.masked_tokens
    stats.max_staleness = max(stats.max_staleness, int(stats.version - mb.policy_versions.min()))


def oldest_token_staleness(batch: TrainingBatch, version: int) -> int:
    """Versions between the weights trained and the oldest loss token's policy, over the whole
    batch: samples the trainer did not compute (`zero_advantage.py`) were still sampled that
    long ago."""
    versions = [
        version
        for sample in batch.samples
        for version, keep in zip(sample.policy_versions, sample.completion_mask, strict=True)
        if keep
    ]
    return max(0, version - min(versions)) if versions else 0


def record_last_update(
    stats: StepStats, output: LossOutput, logprobs: torch.Tensor, before: torch.Tensor | None
) -> None:
    """Metrics of the batch's last update: the tokens its clip acted on (against the proximal
    policy it acts only here, after an earlier update moved the weights) and, when there were
    earlier updates, how far they had moved the policy on these tokens (k3 of KL(π_before ‖ π),
    `before` the logprobs the batch started from)."""
    stats.clipped_tokens += output.clipped_tokens
    if before is not None:
        log_ratio = logprobs - before  # log(π / π_before)
        finite = torch.isfinite(log_ratio)
        # k3, r = π / π_before, on tokens sampled (nearly) from π_before: E[r − 1 − log r]
        stats.update_kl_sum += float((torch.exp(log_ratio) - 1 - log_ratio)[finite].sum())
