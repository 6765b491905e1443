"""A verifiers worker: `python -m asyncrl.envs.verifiers.worker describe|serve '<json spec>'`.

It loads the environment as verifiers does (`setup.py`: asyncrl's defaults, the refusals), with
the same isolation as a reward worker (`reward_worker.py`): started without the run's secret
and keys, its own session, killed by the kernel when its pool's process dies, an optional cap
on its address space (inherited by the tool servers it starts), and its tasks and answers on
private descriptors (fd 0 and 1 point at /dev/null and stderr before any environment code
runs). It holds one key of its own, the token gate's (`$ASYNCRL_GATE_API_KEY`): verifiers'
train client sends it with every model call, and verifiers' subprocess runtime withholds every
`*API_KEY*` variable from the tool servers and harness programs it starts.

- `describe`: one `Described` line (the tasks of each split, the reward functions) or a
  `Refused` one, then exit: the orchestrator's start-up.
- `serve`: `Ready`, then one `Run` line per episode; each is played concurrently
  (`Env.run_slot`, the environment's own rollout logic) and answered with `Done` (the episode's
  record) or `Failed`. `Started` names each trace as it begins (its turns reach the gate under
  its id), and `Beat` every `BEAT_S` seconds tells the pool the event loop is alive.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import zlib
from typing import Any

import msgspec

from asyncrl.config.import_path import user_code_runs_here
from asyncrl.envs.reward_worker import limit_memory, private_channels
from asyncrl.envs.verifiers import record

BEAT_S = 1.0
EVAL_BUCKETS = 8  # as `envs.base.split_of`: one task in eight held out, by its key's hash


def main() -> None:
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    tasks_in, answers = private_channels()
    limit_memory(spec.get("memory_limit"))
    user_code_runs_here()

    def send(message: Any) -> None:
        answers.write(msgspec.json.encode(message).decode() + "\n")
        answers.flush()

    try:
        loaded = Loaded(spec)
    except Exception as error:  # a refusal, or the environment failing to load: said once
        from asyncrl.envs.verifiers.setup import Refusal

        reason = str(error) if isinstance(error, Refusal) else f"{type(error).__name__}: {error}"
        send(record.Refused(reason))
        return
    if mode == "describe":
        send(loaded.described())
        return
    asyncio.run(serve(loaded, tasks_in, send))


class Loaded:
    """The environment, its tasks by key, and the model context its episodes are played with."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from transformers import AutoTokenizer
        from verifiers.v1.utils.loaders import load_environment

        from asyncrl.envs.verifiers.openenv_client import supply_base_url
        from asyncrl.envs.verifiers.setup import check_task, env_config

        self.spec = spec
        supply_base_url()
        self.config, self.notes = env_config(
            spec["id"], spec.get("args") or {}, spec.get("allow_host_commands", False)
        )
        self.env = load_environment(self.config)
        tasks = list(itertools.islice(self.env.taskset, spec.get("max_tasks", 10_000)))
        self.tasks, skipped = {}, []
        for task in tasks:
            problem = check_task(task.data)
            if problem is None:
                self.tasks[task.key] = task
            else:
                skipped.append(problem)
        if skipped:
            self.notes.append(f"{len(skipped)} task(s) skipped: {skipped[0]}")
        if not self.tasks:
            from asyncrl.envs.verifiers.setup import Refusal

            raise Refusal(
                "it has no task that can run here" + (f" ({skipped[0]})" if skipped else "")
            )
        self.renderer = renderer_config(spec.get("renderer"))
        self.tokenizer = AutoTokenizer.from_pretrained(spec["model"])
        self._check_renderer()

    def _check_renderer(self) -> None:
        """Build the renderer once now: a model it cannot render for is refused at start-up."""
        from renderers import create_renderer

        create_renderer(self.tokenizer, self.renderer)

    def split(self) -> tuple[list[Any], list[Any]]:
        from verifiers.v1.configs.select import SelectConfig

        tasks = list(self.tasks.values())
        train_select, eval_select = self.spec.get("train_select"), self.spec.get("eval_select")
        if train_select is None and eval_select is None:
            held = [t for t in tasks if zlib.crc32(t.key.encode()) % EVAL_BUCKETS == 0]
            train = [t for t in tasks if t not in held]
            if not train:  # a taskset too small to hold one out: every task trains
                self.notes.append(f"all {len(tasks)} task(s) train: too few to hold one out")
                return tasks, []
            return train, held

        def chosen(select: dict[str, Any]) -> list[Any]:
            keys = {t.key for t in self.env.taskset.select(SelectConfig(**select))}
            return [t for t in tasks if t.key in keys]

        train = chosen(train_select) if train_select is not None else None
        held = chosen(eval_select) if eval_select is not None else None
        if train is None:
            train = [t for t in tasks if t not in (held or [])]
        if held is None:
            held = [t for t in tasks if t not in train]
        return train, held

    def described(self) -> record.Described:
        from asyncrl.envs.verifiers.setup import reward_weights

        train, held = self.split()
        return record.Described(
            train=[task_item(t) for t in train],
            eval=[task_item(t) for t in held],
            rewards=reward_weights(next(iter(self.tasks.values()))),
            notes=self.notes,
        )

    def context(self, temperature: float) -> Any:
        import verifiers.v1 as vf

        spec = self.spec
        return vf.ModelContext(
            model=spec["served_name"],
            client=vf.TrainClientConfig(
                base_url=spec["gate_url"].rstrip("/") + "/v1",
                api_key_var=record.GATE_KEY_VAR,
                renderer=self.renderer,
                renderer_model_name=spec["model"],
            ),
            # the rest of the run's sampling (top_p, max_tokens...) is the gate's to apply
            sampling=vf.SamplingConfig(temperature=temperature),
        )


def renderer_config(given: dict[str, Any] | None) -> Any:
    """The renderers config: the one given, else asyncrl's Hermes renderer."""
    from pydantic import TypeAdapter
    from renderers import CustomRendererConfig, RendererConfig

    from asyncrl.envs.verifiers.renderer import IMPORT_PATH

    if given is None:
        return CustomRendererConfig(import_path=IMPORT_PATH)
    return TypeAdapter(RendererConfig).validate_python(given)


def task_item(task: Any) -> record.Task:
    data = task.data
    prompt = data.prompt
    if isinstance(prompt, str):
        shown = prompt
    elif prompt:
        shown = str(getattr(prompt[-1], "content", "") or "")
    else:
        shown = f"(task {data.name or data.id or data.idx}: no prompt; the environment opens it)"
    return record.Task(
        key=task.key,
        name=str(data.name or data.id or data.idx),
        prompt=[{"role": "user", "content": shown}],
        data=data.model_dump(mode="json"),
    )


async def serve(loaded: Loaded, tasks_in: Any, send: Any) -> None:
    from transformers import PreTrainedTokenizerBase

    from asyncrl.envs.verifiers.episodes import episode_record

    tokenizer: PreTrainedTokenizerBase = loaded.tokenizer
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), tasks_in)
    decoder = msgspec.json.Decoder(record.ToWorker)
    running: dict[str, asyncio.Task[None]] = {}

    async def play(run: record.Run) -> None:
        try:
            task = loaded.tasks[run.key]
            (slot,) = loaded.env.slots(task, 1)
            episode = await loaded.env.run_slot(
                slot,
                loaded.context(run.temperature),
                on_trace=lambda trace: send(record.Started(run.run, trace.id)),
            )
            send(record.Done(run.run, episode_record(episode, decode)))
        except asyncio.CancelledError:
            pass  # the pool gave up on it and counted it
        except Exception as error:  # the environment's code, past verifiers' own boundaries
            send(record.Failed(run.run, "error", f"{type(error).__name__}: {error}"[:2000]))
        finally:
            running.pop(run.run, None)

    async def beat() -> None:
        while True:
            send(record.Beat())
            await asyncio.sleep(BEAT_S)

    async with loaded.env.serving():
        send(record.Ready())
        beating = asyncio.create_task(beat())
        try:
            while line := await reader.readline():
                message = decoder.decode(line)
                if isinstance(message, record.Run):
                    running[message.run] = asyncio.create_task(play(message))
                elif message.run in running:
                    running[message.run].cancel()
        finally:
            beating.cancel()
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)


if __name__ == "__main__":
    main()
    # verifiers and its libraries leave threads behind (a describe would never exit): the work
    # is done and its answers flushed
    sys.stderr.flush()
    os._exit(0)
