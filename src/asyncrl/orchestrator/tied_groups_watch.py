"""Says once, in plain words, when a run has stopped learning because every group ties.

A group whose completions all score alike has advantage 0 everywhere and teaches nothing. When
every group of a batch ties, step after step, while some tie below the best reward the run has
seen, the policy has almost always collapsed onto one answer per prompt (its sampled entropy
near 0): it repeats its wrong answers as surely as its right ones, samples nothing else, and
nothing can correct it. Such a run looks alive — steps go by, reward is flat — so the
orchestrator says what it means and what to try, once, after `window` such steps in a row.
A batch whose groups all tie at the best reward seen is not counted: that task is solved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asyncrl.orchestrator.group import Group

DEFAULT_WINDOW = 10


@dataclass
class TiedGroupsWatch:
    window: int = DEFAULT_WINDOW
    best_reward: float = float("-inf")
    streak: int = 0  # consecutive batches with every group tied, some below the best
    said: bool = False

    def observe(self, groups: Sequence[Group], sampled_entropy: float | None) -> str | None:
        """Feed one batch; the warning to log, the first time the streak reaches `window`."""
        rewards = [r for group in groups for r in group.rewards]
        if rewards:
            self.best_reward = max(self.best_reward, max(rewards))
        all_tied = bool(groups) and all(group.zero_advantage for group in groups)
        below_best = any(max(group.rewards) < self.best_reward for group in groups)
        self.streak = self.streak + 1 if all_tied and below_best else 0
        if self.said or self.streak < self.window:
            return None
        self.said = True
        entropy = "" if sampled_entropy is None else f" (sampled entropy {sampled_entropy:.3f})"
        return (
            f"every group has scored alike for {self.streak} batches in a row while some score "
            f"below the best reward seen ({self.best_reward:g}): each prompt's completions are "
            f"the same answer{entropy}, so these steps carry no learning signal and the "
            "held-out reward will stay where it is. The policy has collapsed onto its answers. "
            "Try: `trainer.num_iterations: 2` (two updates a batch, the second clipped: measured "
            "the best at this), more `orchestrator.rollouts_per_example`, a small "
            "`trainer.loss.entropy_coef` (0.01; 0.03 blew a policy up); docs/training.md, When "
            "learning stops."
        )
