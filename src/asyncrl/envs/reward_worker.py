"""A reward worker process: `python -m asyncrl.envs.reward_worker '<json spec>'`.

It loads the environment itself (from its id and args, so no environment object crosses the
process boundary) and reads tasks and writes answers, one JSON line each, on private
descriptors: before any user code runs, fd 0 is pointed at /dev/null and fd 1 at stderr, so
neither `print` nor a subprocess can read the tasks or corrupt the answers. Each rubric term
is guarded on its own: an exception or a non-finite value gives that term 0 and reports the
traceback. `memory_limit` (GiB of
address space) holds for the worker and its subprocesses; with `cpu_limit` each task may use
that many CPU seconds (RLIMIT_CPU, moved forward before each task): past either the kernel
ends the worker and the pool scores the rollout as failed. For a multi-turn environment a
task may also ask for its answer to a model turn (`"kind": "respond"`), under the same limits.

The worker asks the kernel to kill it when the process that started it dies (PR_SET_PDEATHSIG,
set between fork and exec by the pool): a killed orchestrator or env-server leaves no worker
behind, not even one stuck in a reward.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import traceback
from typing import Any, TextIO

from asyncrl.config.import_path import user_code_runs_here
from asyncrl.envs.base import Example
from asyncrl.envs.multi_turn import reply_problems
from asyncrl.envs.registry import load_environment
from asyncrl.envs.tools import tool_time_budget


def private_channels() -> tuple[TextIO, TextIO]:
    """Tasks in and answers out on descriptors no subprocess inherits (`os.dup` makes them
    non-inheritable); fd 0 becomes /dev/null and fd 1 stderr, so user code reaches neither."""
    tasks, answers = os.dup(0), os.dup(1)
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr  # sys.stdin already reads fd 0, now /dev/null
    return os.fdopen(tasks, "r"), os.fdopen(answers, "w")


def limit_memory(gib: float | None) -> None:
    """Cap this process's address space (inherited by anything it starts); no core files."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if gib is not None:
        limit = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def allow_cpu_seconds(seconds: float | None) -> None:
    """Let the next task use `seconds` more CPU time than this process has used so far."""
    if seconds is None:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))


def main() -> None:
    tasks, channel = private_channels()
    spec = json.loads(sys.argv[1])
    limit_memory(spec.get("memory_limit"))
    user_code_runs_here()  # a reward by import path is imported here, not checked elsewhere
    env = load_environment(spec["id"], spec.get("args") or {})
    for line in tasks:
        task = json.loads(line)
        allow_cpu_seconds(spec.get("cpu_limit"))
        example = Example(**task["example"])
        answer = (
            respond(env, task, example)
            if task.get("kind") == "respond"
            else score(env, task, example)
        )
        channel.write(json.dumps(answer) + "\n")
        channel.flush()


def score(env: Any, task: dict[str, Any], example: Example) -> dict[str, Any]:
    """Each rubric term's value of a completion (single-turn) or of a whole episode's
    messages (multi-turn), and the per-step rewards the task asks for."""
    scored = task["messages"] if "messages" in task else task["completion"]
    values: dict[str, float] = {}
    errors: dict[str, str] = {}
    for term in env.rubric:
        try:
            value = float(term.function(scored, example))
            if not math.isfinite(value):
                raise ValueError(f"reward function `{term.name}` returned {value}")
            values[term.name] = value
        except Exception:  # the user's reward code: any failure costs this term only
            values[term.name] = 0.0
            errors[term.name] = traceback.format_exc()
    steps: list[list[float]] = []
    if task.get("steps") and hasattr(env, "step_rewards"):
        try:
            steps = [[int(end), float(r)] for end, r in env.step_rewards(scored, example)]
            if not all(math.isfinite(r) for _, r in steps):
                raise ValueError("step_rewards returned a non-finite reward")
            if isinstance(scored, list):  # an episode: steps end at model turns, by index
                turns = sum(message["role"] == "assistant" for message in scored)
                if not all(0 <= turn < turns for turn, _ in steps):
                    raise ValueError(f"step_rewards named a turn outside 0..{turns - 1}")
        except Exception:  # the user's code again: no steps means no process advantage
            steps = []
            errors["step_rewards"] = traceback.format_exc()
    return {"values": values, "errors": errors, "steps": steps}


def respond(env: Any, task: dict[str, Any], example: Example) -> dict[str, Any]:
    """A multi-turn environment's answer to the last model turn, or the reason it has none:
    `error` the exception's last line (what may be shown to a client), `traceback` the whole
    (for the log). The turn's tool calls share `tool_budget` seconds (`tools.py`)."""
    try:
        with tool_time_budget(task.get("tool_budget")):
            reply = env.respond(task["messages"], example)
        problem = reply_problems(reply)
    except Exception as error:  # the environment's code: its failure ends this episode only
        summary = traceback.format_exception_only(type(error), error)[-1].strip()
        return {"error": summary[:500], "traceback": traceback.format_exc()}
    if problem is not None:
        return {"error": problem}
    calls = [[record.tool, record.error] for record in reply.tool_calls]
    return {"messages": reply.messages, "done": reply.done, "tool_calls": calls}


if __name__ == "__main__":
    main()
