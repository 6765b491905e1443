"""A reward worker process: `python -m asyncrl.envs.reward_worker '<json env spec>'`.

It loads the environment itself (from its id and args, so no environment object crosses the
process boundary) and answers one JSON line per task on a private copy of stdout; the user's
reward code may print freely, its output goes to stderr. Each rubric term is guarded on its
own: an exception or a non-finite value gives that term 0 and reports the traceback.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback

from asyncrl.envs.base import Example
from asyncrl.envs.registry import load_environment


def main() -> None:
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # reward code that prints must not corrupt the protocol
    spec = json.loads(sys.argv[1])
    env = load_environment(spec["id"], spec.get("args") or {})
    for line in sys.stdin:
        task = json.loads(line)
        example = Example(**task["example"])
        values: dict[str, float] = {}
        errors: dict[str, str] = {}
        for term in env.rubric:
            try:
                value = float(term.function(task["completion"], example))
                if not math.isfinite(value):
                    raise ValueError(f"reward function `{term.name}` returned {value}")
                values[term.name] = value
            except Exception:  # the user's reward code: any failure costs this term only
                values[term.name] = 0.0
                errors[term.name] = traceback.format_exc()
        steps: list[list[float]] = []
        if task.get("steps") and hasattr(env, "step_rewards"):
            try:
                steps = [
                    [int(end), float(r)] for end, r in env.step_rewards(task["completion"], example)
                ]
                if not all(math.isfinite(r) for _, r in steps):
                    raise ValueError("step_rewards returned a non-finite reward")
            except Exception:  # the user's code again: no steps means no process advantage
                steps = []
                errors["step_rewards"] = traceback.format_exc()
        channel.write(json.dumps({"values": values, "errors": errors, "steps": steps}) + "\n")
        channel.flush()


if __name__ == "__main__":
    main()
