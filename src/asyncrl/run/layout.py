"""The layout of a run on disk: every file and directory a run's processes share, named once.

A run lives in two directories. The **output directory** (`output_dir` of `asyncrl rl` and of
the trainer) holds what the launcher keeps for the whole run; the **run directory**
`<output_dir>/run_<name>` (the orchestrator's `output_dir`; `run_default` unless set) holds
what the roles hand each other and leave behind. The names are the contract between writers
and readers in different processes, so each is a constant here, and each path a function:

    <output_dir>/
      configs/<label>.yaml            launcher -> the role it starts (`asyncrl <role> <file>`)
      logs/<label>.log                launcher, each role's output -> you
      logs/roles.json                 Ray launcher: where each role ran, how it ended -> you
      heartbeats/<role>               each role, every second -> the supervisor (hang check)
      heartbeats/trainer_waiting      while the trainer waits and lends its core (core_lending.py)
      .cluster_probe/<run id>/        Ray actors -> the launcher's shared-storage check
      run_<name>/                     the run directory:
        rollouts/step_N/batch.msgpack   orchestrator -> trainer (filesystem rollout transport)
        rollouts/DONE                   orchestrator: no batch will follow -> trainer
        broadcasts/step_N/ + STABLE     trainer -> inference servers, `asyncrl eval`, export
        broadcasts/LOCK                 orchestrator holds it shared while servers load a step,
                                        the trainer exclusive to prune
        served_base/ + SERVED_BASE      QLoRA trainer -> orchestrator (loads it into servers)
        checkpoints/step_N/<role>/ + COMPLETE   trainer, orchestrator -> themselves on resume
        metrics.jsonl                   every role -> live view, trackers, `plot`, run audit
        samples/step_N.jsonl            orchestrator -> trackers
        tensorboard/                    the tensorboard tracker (unless `tensorboard_dir`)
        FINISHED                        orchestrator: done with the servers -> colocated trainer

Every file is written under a hidden temporary name and renamed, and a marker (`STABLE`,
`COMPLETE`, `SERVED_BASE`) is written last, so a reader that sees the marker sees it whole.
What is inside one role's own checkpoint part (the trainer's shards, the orchestrator's state)
is that role's format, named by its checkpoint code; a step directory is
`step_dirs.step_name(N)`.

The trainer finds the run directory from its own config (`output_dir` and `run_name`, which
`asyncrl rl` copies from the orchestrator's `output_dir`), never by looking for one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from asyncrl.log import get_logger
from asyncrl.step_dirs import step_name
from asyncrl.waiting import Wait

logger = get_logger(__name__)

# --- the output directory -------------------------------------------------------------------
RUN_DIR_PREFIX = "run_"  # a run directory is `run_<name>`, directly in the output directory
DEFAULT_RUN_NAME = "default"
CONFIGS_DIR = "configs"
LOGS_DIR = "logs"
ROLES_RECORD = "roles.json"  # in logs/
HEARTBEATS_DIR = "heartbeats"
CLUSTER_PROBES_DIR = ".cluster_probe"

# --- the run directory ----------------------------------------------------------------------
ROLLOUTS_DIR = "rollouts"
BATCH_FILE = "batch.msgpack"  # in rollouts/step_N/
ROLLOUTS_DONE = "DONE"  # in rollouts/
BROADCASTS_DIR = "broadcasts"
BROADCAST_STABLE = "STABLE"  # in broadcasts/step_N/, written last
BROADCASTS_LOCK = "LOCK"  # in broadcasts/
SERVED_BASE_DIR = "served_base"
SERVED_BASE_MARKER = "SERVED_BASE"  # in served_base/, written last
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_COMPLETE = "COMPLETE"  # in checkpoints/step_N/<role>/, written last
METRICS_FILE = "metrics.jsonl"
SAMPLES_DIR = "samples"
TENSORBOARD_DIR = "tensorboard"
RUN_FINISHED = "FINISHED"


class RunPlacement(Protocol):
    """Where a role that does not own the run directory is told it is (the trainer's config)."""

    output_dir: str
    run_name: str


# --- the output directory -------------------------------------------------------------------


def run_dir(output_dir: str | Path, run_name: str = DEFAULT_RUN_NAME) -> Path:
    """`<output_dir>/run_<run_name>`: the run directory. The orchestrator creates it; the
    trainer and the launchers compute it from the same two values."""
    if not run_name or Path(run_name).name != run_name:
        raise ValueError(f"run name {run_name!r}: a run is named by one plain path component")
    return Path(output_dir) / f"{RUN_DIR_PREFIX}{run_name}"


def run_name_of(path: str | Path) -> str | None:
    """The name of the run directory `path` (`run_x` -> `x`); None for any other name."""
    name = Path(path).name
    if not name.startswith(RUN_DIR_PREFIX) or name == RUN_DIR_PREFIX:
        return None
    return name[len(RUN_DIR_PREFIX) :]


def placed_run_dir(placement: RunPlacement) -> Path:
    """The run directory a role's config places it in (`output_dir` and `run_name`)."""
    return run_dir(placement.output_dir, placement.run_name)


def find_run_dir(placement: RunPlacement, timeout: float, timeout_key: str | None = None) -> Path:
    """Wait until the orchestrator has created the run directory `placement` names, saying what
    it waits for; `TimeoutError` after `timeout` seconds names the directory and the config key
    that sets the deadline (`timeout_key`)."""
    path = placed_run_dir(placement)
    wait = Wait(f"the orchestrator's run directory {path}", logger, timeout, key=timeout_key)
    while not path.is_dir():
        wait.check()
        time.sleep(0.1)
    return path


def configs_dir(output_dir: str | Path) -> Path:
    """Each role's resolved config, written by the launcher before it starts the role."""
    return Path(output_dir) / CONFIGS_DIR


def config_file(output_dir: str | Path, label: str) -> Path:
    """`configs/<label>.yaml`: the config a role was started with (`label`: its command, `train`,
    `orch`, `infer`, `judge`, or its Ray label; `trainer_ranks` for a multi-rank trainer). Export
    reads the trainer's (`train`) for the run's model."""
    return configs_dir(output_dir) / f"{label}.yaml"


def logs_dir(output_dir: str | Path) -> Path:
    """Each role's output, and the Ray launcher's record of where the roles ran."""
    return Path(output_dir) / LOGS_DIR


def log_file(output_dir: str | Path, label: str) -> Path:
    return logs_dir(output_dir) / f"{label}.log"


def roles_record(output_dir: str | Path) -> Path:
    """`logs/roles.json`: where each Ray role ran (node, pid, URL, rank) and how it ended."""
    return logs_dir(output_dir) / ROLES_RECORD


def heartbeat_file(output_dir: str | Path, role: str) -> Path:
    """Touched every second by `role` (`heartbeat.py`); the supervisor restarts a silent one."""
    return Path(output_dir) / HEARTBEATS_DIR / role


def lend_flag_file(output_dir: str | Path) -> Path:
    """Exists while the trainer waits for a batch and lends its core (`core_lending.py`): in
    the heartbeats folder the launcher owns, so clearing a stale one never touches a user's
    file."""
    return Path(output_dir) / HEARTBEATS_DIR / "trainer_waiting"


def cluster_probes_dir(output_dir: str | Path) -> Path:
    """Where Ray actors leave probe files to learn whether they share the output directory."""
    return Path(output_dir) / CLUSTER_PROBES_DIR


# --- the run directory ----------------------------------------------------------------------


def rollouts_dir(run_dir: str | Path) -> Path:
    """The filesystem rollout transport: one `step_N` directory per batch, then `DONE`."""
    return Path(run_dir) / ROLLOUTS_DIR


def batch_file(run_dir: str | Path, step: int) -> Path:
    """Training batch `step` (a msgpack `TrainingBatch`), orchestrator -> trainer."""
    return rollouts_dir(run_dir) / step_name(step) / BATCH_FILE


def rollouts_done(run_dir: str | Path) -> Path:
    """Written by the orchestrator when it will send no more batches; the trainer stops."""
    return rollouts_dir(run_dir) / ROLLOUTS_DONE


def broadcasts_dir(run_dir: str | Path) -> Path:
    """The filesystem weight broadcast: one `step_N` directory per weights version."""
    return Path(run_dir) / BROADCASTS_DIR


def broadcast_dir(run_dir: str | Path, step: int) -> Path:
    """Weights version `step` (a Hugging Face checkpoint or a PEFT adapter; an NCCL broadcast
    leaves only the marker), complete once `STABLE` is in it."""
    return broadcasts_dir(run_dir) / step_name(step)


def broadcasts_lock(run_dir: str | Path) -> Path:
    """The `flock` that keeps the trainer from pruning a step the servers are loading."""
    return broadcasts_dir(run_dir) / BROADCASTS_LOCK


def served_base_dir(run_dir: str | Path) -> Path:
    """A QLoRA trainer's dequantized base, written once at start, for the servers' adapters."""
    return Path(run_dir) / SERVED_BASE_DIR


def checkpoints_dir(run_dir: str | Path) -> Path:
    """`step_N/<role>/` per checkpoint, each role's part complete once `COMPLETE` is in it (the
    trainer's may live elsewhere: `checkpoint_dir` in its config)."""
    return Path(run_dir) / CHECKPOINTS_DIR


def metrics_file(run_dir: str | Path) -> Path:
    """One JSON record per step and role (`monitor/metrics.py`), appended by every role. SFT's
    output directory names its records the same, so `asyncrl plot` reads either."""
    return Path(run_dir) / METRICS_FILE


def samples_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / SAMPLES_DIR


def samples_file(run_dir: str | Path, step: int) -> Path:
    """Some of batch `step`'s prompts, completions and rewards as JSON lines, for the trackers."""
    return samples_dir(run_dir) / f"{step_name(step)}.jsonl"


def tensorboard_dir(run_dir: str | Path) -> Path:
    """The tensorboard tracker's event files, unless `report_to.tensorboard_dir` says where."""
    return Path(run_dir) / TENSORBOARD_DIR


def finished_marker(run_dir: str | Path) -> Path:
    """The orchestrator is done with the inference servers (`transport/run_end.py`)."""
    return Path(run_dir) / RUN_FINISHED
