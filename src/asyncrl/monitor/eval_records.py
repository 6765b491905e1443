"""The `eval/<env>/…` records, one shape for online evaluation and `asyncrl eval`.

From each example's k samples: `mean@k` (mean reward of all samples), `best@k` (mean over
examples of the best of k), `pass@k` (share of examples whose best sample reaches a threshold),
and the weights versions that produced the tokens (`version` and `version_max` differ when an
update landed mid-evaluation).
"""

from __future__ import annotations

import statistics
from typing import Any


def summarize(
    name: str, results: list[list[tuple[float, list[int]]]], threshold: float, launch_version: int
) -> dict[str, Any]:
    """The `eval/<name>/…` record from each example's k (reward, token versions) samples."""
    k = len(results[0]) if results else 0
    best = [max(reward for reward, _ in samples) for samples in results]
    versions = [v for samples in results for _, sampled_by in samples for v in sampled_by]
    prefix = f"eval/{name}"
    return {
        f"{prefix}/mean@{k}": statistics.fmean(r for samples in results for r, _ in samples),
        f"{prefix}/best@{k}": statistics.fmean(best),
        f"{prefix}/pass@{k}": statistics.fmean(b >= threshold for b in best),
        f"{prefix}/num_examples": len(results),
        f"{prefix}/version": min(versions, default=launch_version),
        f"{prefix}/version_max": max(versions, default=launch_version),
    }
