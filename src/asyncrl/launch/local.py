"""`asyncrl rl`: inference, orchestrator and trainer started together on this machine.

Each role runs as `asyncrl infer|orch|train <its config>` (files written to
`<output_dir>/configs/`, so any role can be restarted by hand the same way) with its log in
`<output_dir>/logs/`. Inference starts first and must answer /health; then the trainer and the
orchestrator. The run ends when trainer and orchestrator have finished; if any role fails, or on
Ctrl-C, all three are stopped and the failing role's log tail is shown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from asyncrl.config.rl import RLConfig
from asyncrl.launch.live_view import LiveView
from asyncrl.launch.roles import RoleFailed, prepare_resume, reporter_for, role_yaml
from asyncrl.log import get_logger
from asyncrl.monitor.trackers import Reporter
from asyncrl.processes import start, stop, tail, wait_healthy

logger = get_logger(__name__)

ROLES = ("infer", "orch", "train")


def write_role_configs(config: RLConfig, directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    sections = {"infer": config.inference, "orch": config.orchestrator, "train": config.trainer}
    paths = {}
    for role, section in sections.items():
        path = directory / f"{role}.yaml"
        path.write_text(role_yaml(section))
        paths[role] = path
    return paths


def thread_budget() -> dict[str, dict[str, str]]:
    """On a CPU-only machine, split the cores between inference and trainer instead of letting
    each torch process use all of them (oversubscription slows both). A user's own
    OMP_NUM_THREADS wins; GPU machines are left alone."""
    import torch

    if torch.cuda.is_available() or "OMP_NUM_THREADS" in os.environ:
        return {role: {} for role in ROLES}
    half = str(max(1, (os.cpu_count() or 2) // 2))
    return {"infer": {"OMP_NUM_THREADS": half}, "train": {"OMP_NUM_THREADS": half},
            "orch": {"OMP_NUM_THREADS": "1"}}  # fmt: skip


def run_rl(config: RLConfig) -> None:
    output = Path(config.output_dir)
    logs = output / "logs"
    config = prepare_resume(config)
    paths = write_role_configs(config, output / "configs")
    command = [sys.executable, "-m", "asyncrl.cli"]
    threads = thread_budget()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    # SIGTERM (a scheduler, `kill`) takes the same path as Ctrl-C: the `finally` below stops the
    # children gently; if the launcher is SIGKILLed the kernel still ends them (PDEATHSIG)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        processes["infer"] = start(
            [*command, "infer", str(paths["infer"])], logs / "infer.log", threads["infer"]
        )
        host = config.inference.host
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{config.inference.port}"
        wait_healthy(url, processes["infer"], timeout=600)
        logger.info("rl: inference ready at %s; starting trainer and orchestrator", url)
        for role in ("train", "orch"):
            processes[role] = start(
                [*command, role, str(paths[role])], logs / f"{role}.log", threads[role]
            )
        supervise(processes, logs, config)
    except KeyboardInterrupt:
        logger.warning("rl: interrupted; stopping every role")
        raise
    finally:
        for process in processes.values():
            stop(process)


def supervise(processes: dict[str, subprocess.Popen[bytes]], logs: Path, config: RLConfig) -> None:
    """Until trainer and orchestrator finish; any failure stops everything. Meanwhile the live
    view and the trackers (`report_to`) follow the run directory."""
    run_dir = Path(config.orchestrator.output_dir)
    view = LiveView(run_dir / "metrics.jsonl", config.max_steps)
    reporter = reporter_for(config)
    try:
        with view:
            follow(processes, logs, view, reporter)
    finally:
        if reporter is not None:
            reporter.close()


def follow(
    processes: dict[str, subprocess.Popen[bytes]],
    logs: Path,
    view: LiveView,
    reporter: Reporter | None,
) -> None:
    """Poll the roles twice a second until trainer and orchestrator exit 0; raise on a failure."""
    while True:
        for role, process in processes.items():
            code = process.poll()
            if code not in (None, 0):
                raise RoleFailed(
                    f"`asyncrl {role}` exited with code {code}; end of "
                    f"{logs / f'{role}.log'}:\n{tail(logs / f'{role}.log')}"
                )
            if role == "infer" and code == 0:
                raise RoleFailed("the inference server stopped before training ended")
        view.refresh()
        if reporter is not None:
            reporter.refresh()
        if all(processes[role].poll() == 0 for role in ("train", "orch")):
            logger.info("rl: trainer and orchestrator finished")
            return
        time.sleep(0.5)
