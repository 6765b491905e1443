"""A finished verifiers episode as plain data (`record.EpisodeRecord`). Runs in the worker.

Only what the orchestrator trains on and reports crosses: each trainable branch's token ids,
sampled mask and logprobs (verifiers' graph: a conversation whose re-render does not extend the
sampled ids exactly becomes a new branch, each branch one training sample), the rewards with
their weights, the metrics, how the trace stopped and why it failed, and counts of turns and
tool calls.

Tool calls are counted from what the model wrote, whatever the harness made of it: every
`<tool_call>` block of a sampled turn, by tool, or by how it failed to parse (`none/<status>`,
the renderer's statuses); a tool message that answers with an error adds `<tool>/error`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from verifiers.v1.episode import Episode
from verifiers.v1.trace import Trace

from asyncrl.envs.verifiers.chat_harness import OVERLONG
from asyncrl.envs.verifiers.record import Branch, EpisodeRecord, TraceRecord
from asyncrl.envs.verifiers.renderer import BLOCK, parse_call, text_of

ERROR_RESULT = re.compile(r"^\s*error\b", re.IGNORECASE)
MESSAGE_LIMIT = 2000  # characters of an error message sent to the orchestrator's log


def episode_record(episode: Episode, decode: Callable[[list[int]], str]) -> EpisodeRecord:
    first = episode.errors[0].message if episode.errors else ""
    return EpisodeRecord(
        ok=episode.ok,
        traces=[trace_record(trace, decode) for trace in episode.traces],
        errors=[error.type for error in episode.errors],
        error=first[:MESSAGE_LIMIT],
    )


def trace_record(trace: Trace, decode: Callable[[list[int]], str]) -> TraceRecord:
    trainable = trace.agent is None or trace.agent.trainable
    branches = [
        Branch(branch.token_ids, branch.sampled_mask, branch.logprobs)
        for branch in trace.branches
        if branch.trainable
    ]
    timing = trace.timing
    return TraceRecord(
        id=trace.id,
        trainable=trainable,
        branches=branches,
        rewards={
            name: (None, 1.0) if reward is None else (reward.score, reward.weight)
            for name, reward in trace.rewards.items()
        },
        metrics=dict(trace.metrics),
        stop=trace.stop_condition,
        errors=[error.type for error in trace.errors],
        error=(trace.errors[0].message if trace.errors else "")[:MESSAGE_LIMIT],
        turns=trace.num_turns,
        tool_calls=tool_calls(trace, decode),
        context_full=any(
            call.error is not None and OVERLONG in call.error.message for call in trace.calls
        ),
        seconds={
            "setup": timing.setup.duration,
            "model": timing.agent.model.duration,
            "harness": timing.agent.harness.duration,
            "scoring": timing.scoring.duration,
        },
    )


def tool_calls(trace: Trace, decode: Callable[[list[int]], str]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    names = {tool.name for tool in (trace.nodes[0].tools if trace.nodes else [])}
    for node in trace.nodes:
        if node.sampled:
            text = decode(
                [t for t, sampled in zip(node.token_ids, node.mask, strict=False) if sampled]
            )
            for match in BLOCK.finditer(text):
                call = parse_call(match, names or None)
                if call.status == "ok":
                    counts[str(call.name)] += 1
                else:
                    counts["none"] += 1
                    counts[f"none/{call.status}"] += 1
        elif node.message.role == "tool" and ERROR_RESULT.match(text_of(node.message.content)):
            counts[f"{node.message.name or 'none'}/error"] += 1
    return dict(counts)
