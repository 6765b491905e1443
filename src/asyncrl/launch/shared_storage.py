"""Whether a cluster run's roles share the run directory, and whether this config needs them to.

Each actor writes a probe file into `output_dir/.cluster_probe/<run id>/` and looks for every
other actor's (see `RoleActor.write_probe`); this judges what they found, and the probes are
removed once judged (`remove_probes`).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping
from pathlib import Path

from asyncrl.config.rl import RLConfig
from asyncrl.launch.roles import RoleFailed
from asyncrl.log import get_logger
from asyncrl.run.layout import cluster_probes_dir

logger = get_logger(__name__)


def probe_dir(output: Path, run_id: str) -> Path:
    return cluster_probes_dir(output) / run_id


def remove_probes(output: Path, run_id: str) -> None:
    """Remove this run's probe directory, and the probes' folder once no other run's is in it."""
    shutil.rmtree(probe_dir(output, run_id), ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: another run is probing now
        cluster_probes_dir(output).rmdir()


def shared_storage_needs(config: RLConfig) -> list[str]:
    """What in this config reads, on one node, files another node wrote."""
    needs = []
    if config.orchestrator.rollout_transport.type == "filesystem":
        needs.append("`rollout_transport.type: filesystem` (batches)")
    if config.trainer.weight_broadcast.type == "filesystem":
        needs.append("`weight_broadcast.type: filesystem` (weights)")
    if config.orchestrator.ckpt.interval is not None:
        needs.append("checkpoints (`ckpt.interval`)")
    return needs


def judge_shared_storage(
    config: RLConfig,
    output: Path,
    write_errors: Mapping[str, str | None],
    unseen: Mapping[str, list[str]],
) -> None:
    """Raise RoleFailed if the config needs a shared run directory the actors do not have.

    `write_errors`: actor label -> why it could not write its probe (None = it could);
    `unseen`: actor label -> labels whose probes it does not see.
    """
    problems = [error for error in write_errors.values() if error]
    problems += [
        f"{label} does not see what {', '.join(missing)} wrote"
        for label, missing in unseen.items()
        if missing
    ]
    if not problems:
        return
    message = f"the run directory {output} is not one shared directory for every actor: " + (
        "; ".join(problems)
    )
    needs = shared_storage_needs(config)
    if needs:
        raise RoleFailed(
            f"{message}. It must be, for {', '.join(needs)}: put `output_dir` on storage every "
            "node mounts at the same path (NFS, a cluster file system), or use "
            "`rollout_transport.type: zmq` and `weight_broadcast.type: nccl` without checkpoints"
        )
    logger.warning("rl: %s (fine for this config: batches and weights go over the network)",
                   message)  # fmt: skip
