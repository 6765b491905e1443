"""The one rollout path: a group of episodes, generated, scored and made training samples.

A single-turn rollout is a one-turn episode; a multi-turn one goes on with the environment.
The first turn is one request for the whole group (`n` completions: the prompt is prefilled
once); then each multi-turn episode goes on by itself, every turn generated from the exact ids
of everything so far (the prompt, the model's own tokens, the environment's rendered messages;
`EpisodeTokens`). The training sample is the episode as one sequence: the prompt, then the
model's and the environment's tokens in order, only the model's in the loss, each with the
logprob and weights version it was sampled with. The environment runs in the reward workers:
a turn it fails to answer (raises, hangs, dies) ends that episode, which then scores 0 and is
masked out of the loss, and is counted; the run goes on. With `advantage.type: process` the
environment's per-step rewards (a single turn's at character offsets of its text, an episode's
at model turns) give each token the normalised rewards of its step and the steps after it.
Training and online evaluation (`online_eval.py`, with its own sampling) both come here.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from asyncrl.config.base import ConfigError
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs.base import Environment, Messages
from asyncrl.envs.episode_tokens import EpisodeTokens, SuffixError
from asyncrl.envs.multi_turn import is_multi_turn
from asyncrl.envs.reward_pool import EnvironmentFailed, EnvironmentPool, RewardResult
from asyncrl.envs.verifiers.pool import VerifiersPool
from asyncrl.orchestrator.advantage import group_advantages, process_advantages
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.filters import apply_filters
from asyncrl.orchestrator.generation import ABORT_RETRIES, Completion, Server, generate
from asyncrl.orchestrator.group import Group, GroupRequest, request_body
from asyncrl.orchestrator.verifiers_group import run_verifiers_group
from asyncrl.types import TrainingSample


@dataclass
class Episode:
    messages: Messages
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)  # model and environment tokens
    sampled: list[bool] = field(default_factory=list)  # True where the model sampled the token
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_lengths: list[int] = field(default_factory=list)  # tokens of each model turn
    turn_ends: list[int] = field(default_factory=list)  # index of each model turn's last token
    finish_reason: str = ""  # of the last model turn
    ended_by: str = ""  # done | max_turns | budget | env_<failure> | suffix_error
    server: Server | None = None  # where its turns go (its prefix is cached there)
    tool_calls: Counter[str] = field(default_factory=Counter)  # "<tool>" and "<tool>/<error>"
    cut_turns: int = 0  # turns cut by `max_tokens`, closed with an end-of-turn token not sampled
    single_turn: bool = False  # one model turn: scored on its text, steps in its characters
    text: str = ""  # the last model turn's text

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def failed(self) -> bool:
        """Ended by the environment or its template, not by the model: not trained on."""
        return self.ended_by.startswith("env_") or self.ended_by == "suffix_error"

    @property
    def truncated(self) -> bool:
        """Cut by the token budget: a single turn by `max_tokens`, an episode by `seq_len`."""
        return self.finish_reason == "length" if self.single_turn else self.ended_by == "budget"

    def add_model_turn(self, choice: Completion, version: int) -> None:
        n = len(choice.token_ids)
        self.completion_ids += choice.token_ids
        self.sampled += [True] * n
        self.logprobs += choice.logprobs
        self.versions += choice.policy_versions or [version] * n
        self.turn_lengths.append(n)
        self.turn_ends.append(len(self.completion_ids) - 1)
        self.finish_reason = choice.finish_reason
        self.text = choice.text
        self.messages.append({"role": "assistant", "content": choice.text})

    def add_environment(self, messages: Messages, token_ids: list[int]) -> None:
        """Tokens the model did not sample (the environment's messages, the closing of a cut
        turn): not trained on; their version is that of the model token before them, so they
        change no staleness bound."""
        self.completion_ids += token_ids
        self.sampled += [False] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        self.versions += [self.versions[-1]] * len(token_ids)
        self.messages.extend(messages)


@dataclass(frozen=True)
class EpisodeSetting:
    """How a group's episodes are played: `tokens` (the turn-by-turn tokenizer) for a
    multi-turn environment, None for a single-turn one (then `decode` maps per-step rewards
    from characters to tokens)."""

    config: OrchestratorConfig
    clients: ClientPool
    pool: EnvironmentPool
    tokens: EpisodeTokens | None
    max_turns: int = 1
    decode: Callable[[list[int]], str] | None = None
    abort_retries: int = ABORT_RETRIES


async def run_episode_group(
    request: GroupRequest, setting: EpisodeSetting, vocab_size: int
) -> Group:
    """`rollouts_per_example` episodes of the drawn example, scored and made training samples.
    Whether the group trains (the buffer's difficulty filter) is the caller's to decide."""
    if isinstance(setting.pool, VerifiersPool):  # the environment plays its own episodes
        return await run_verifiers_group(request, setting.config, setting.pool, vocab_size)
    config, clients = setting.config, setting.clients
    started = time.perf_counter()
    route, body, prompt_ids = first_turn(request, setting)
    server, choices, retries = await generate(
        clients, route, body, config.rollouts_per_example, abort_retries=setting.abort_retries
    )
    single_turn = setting.tokens is None
    episodes = [
        Episode(
            list(request.drawn.example.prompt),
            choice.prompt_ids if prompt_ids is None else list(prompt_ids),
            server=server,
            single_turn=single_turn,
        )
        for choice in choices
    ]
    for episode, choice in zip(episodes, choices, strict=True):
        episode.add_model_turn(choice, request.launch_version)
    if not single_turn:
        await asyncio.gather(
            *(play(episode, index, request, setting) for index, episode in enumerate(episodes))
        )
    played = time.perf_counter()
    scored = await score(episodes, request, setting)
    group = to_group(request, episodes, scored, config, vocab_size, setting.decode)
    group.aborted_retries = retries
    group.generate_seconds = played - started  # the environment's turns included
    group.score_seconds = time.perf_counter() - played
    return group


def first_turn(
    request: GroupRequest, setting: EpisodeSetting
) -> tuple[str, dict[str, Any], list[int] | None]:
    """The route and body of the group's first request, and the prompt's ids where this side
    tokenizes them: a single turn asks as the example is given (token ids to the completions
    route, messages to chat, the prompt's ids then coming back with the response); a
    multi-turn episode sends the ids it will extend turn by turn, within `seq_len`."""
    config = setting.config
    route, body = request_body(request, config)
    if setting.tokens is None:
        return route, body, None
    prompt_ids = setting.tokens.prompt_ids(request.drawn.example.prompt)
    budget = max(1, config.seq_len - len(prompt_ids))
    body.pop("messages", None)
    body.update(
        prompt=prompt_ids, logprobs=0, max_tokens=min(budget, config.sampling.max_tokens or budget)
    )
    if setting.tokens.stop_token_ids:  # a turn closed by a token other than the EOS
        body["stop_token_ids"] = setting.tokens.stop_token_ids
    return "completions", body, prompt_ids


async def play(
    episode: Episode, index: int, request: GroupRequest, setting: EpisodeSetting
) -> None:
    """Alternate environment and model turns until one of them ends the episode."""
    config, example = setting.config, request.drawn.example
    assert setting.tokens is not None  # multi-turn settings have their tokenizer
    while True:
        if episode.finish_reason == "length" and episode.length >= config.seq_len:
            episode.ended_by = "budget"
            return
        if len(episode.turn_lengths) >= setting.max_turns:
            episode.ended_by = "max_turns"
            return
        try:
            reply = await setting.pool.respond(episode.messages, example)
            if reply.done:
                episode.ended_by = "done"
                return
            closing = []  # a turn cut by max_tokens is closed for the model
            if episode.finish_reason == "length":
                closing = [setting.tokens.end_of_turn]
            turn_end = closing[0] if closing else episode.completion_ids[-1]
            suffix = closing + setting.tokens.suffix_ids(reply.messages, turn_end=turn_end)
        except EnvironmentFailed as failure:
            episode.ended_by = f"env_{failure.kind}"
            return
        except SuffixError:
            episode.ended_by = "suffix_error"
            return
        budget = config.seq_len - episode.length - len(suffix)
        if budget <= 0:
            episode.ended_by = "budget"
            return
        for record in reply.tool_calls:
            tool = record.tool or "none"  # unparseable, or no such tool
            episode.tool_calls[tool] += 1
            if record.error:
                episode.tool_calls[f"{tool}/{record.error}"] += 1
        episode.cut_turns += bool(closing)
        episode.add_environment(reply.messages, suffix)
        body = turn_body(request, config, episode, index, budget)
        if setting.tokens.stop_token_ids:
            body["stop_token_ids"] = setting.tokens.stop_token_ids
        version = setting.clients.oldest_version()  # for every token if the server reports none
        episode.server, (choice,), _ = await generate(
            setting.clients, "completions", body, 1, episode.server, setting.abort_retries
        )
        episode.add_model_turn(choice, version)


def turn_body(
    request: GroupRequest, config: OrchestratorConfig, episode: Episode, index: int, budget: int
) -> dict[str, Any]:
    """The request for the episode's next model turn: everything so far as token ids."""
    _, body = request_body(request, config)
    body.pop("messages", None)
    turn = len(episode.turn_lengths)
    body.update(
        n=1,
        prompt=episode.prompt_ids + episode.completion_ids,
        logprobs=0,
        max_tokens=min(budget, config.sampling.max_tokens or budget),
    )
    if request.seed is not None:  # a seed of its own per episode and turn
        body["seed"] = request.seed + 1_000_003 * turn + index + 1
    return body


async def score(
    episodes: list[Episode], request: GroupRequest, setting: EpisodeSetting
) -> list[RewardResult]:
    """Each episode's reward: a single turn's on its text, an episode's rubric on its whole
    conversation; 0 for one the environment failed, and for all with
    `buffer.skip_verification` (nothing scored, so no reward function's value either)."""
    steps = setting.config.advantage.type == "process"
    example = request.drawn.example

    async def one(episode: Episode) -> RewardResult:
        if setting.config.buffer.skip_verification:
            return RewardResult(0.0, {})
        if episode.failed:
            return RewardResult(0.0, {term.name: 0.0 for term in setting.pool.rubric})
        scored = episode.text if episode.single_turn else episode.messages
        return await setting.pool.score(scored, example, steps=steps)

    return list(await asyncio.gather(*(one(episode) for episode in episodes)))


def to_group(
    request: GroupRequest,
    episodes: list[Episode],
    scored: list[RewardResult],
    config: OrchestratorConfig,
    vocab_size: int,
    decode: Callable[[list[int]], str] | None = None,
) -> Group:
    """Episodes as training samples: advantages per token (outcome or per step), the loss on
    the model's tokens only, filters judged on the model's tokens, each token's policy version
    (the launch version where the server reports none); turns, endings and tool calls counted
    for multi-turn episodes."""
    advantages = episode_advantages(episodes, scored, config, decode)
    group = Group(
        drawn=request.drawn,
        env_name=request.env_name,
        samples=[],
        rewards=[r.reward for r in scored],
        values=[r.values for r in scored],
        truncated=[e.truncated for e in episodes],
        reward_failures=sum(len(r.failed) + (r.lost is not None) for r in scored),
    )
    if not all(e.single_turn for e in episodes):
        group.episode_ends = Counter(e.ended_by for e in episodes)
        group.turns = [len(e.turn_lengths) for e in episodes]
        group.turn_lengths = [n for e in episodes for n in e.turn_lengths]
        group.tool_calls = sum((e.tool_calls for e in episodes), Counter())
        group.cut_turns = sum(e.cut_turns for e in episodes)
    for episode, result, token_advantages in zip(episodes, scored, advantages, strict=True):
        model_ids = [t for t, s in zip(episode.completion_ids, episode.sampled, strict=True) if s]
        model_logprobs = [lp for lp, s in zip(episode.logprobs, episode.sampled, strict=True) if s]
        outcome = apply_filters(
            model_ids, model_logprobs, episode.truncated, config.filters, vocab_size,
            config.mask_truncated_completions,
        )  # fmt: skip
        group.filter_hits.update(name for name, hit in outcome.hits.items() if hit)
        train = outcome.train and not episode.failed
        group.samples.append(
            TrainingSample(
                prompt_ids=episode.prompt_ids,
                completion_ids=episode.completion_ids,
                completion_mask=[train and sampled for sampled in episode.sampled],
                inference_logprobs=episode.logprobs,
                advantages=token_advantages,
                policy_versions=episode.versions,
                temperature=request.temperature,
                env=request.env_name,
                task=request.drawn.example.task,
                example_id=request.drawn.example.example_id,
                reward=result.reward,
            )
        )
    return group


def episode_advantages(
    episodes: list[Episode],
    scored: list[RewardResult],
    config: OrchestratorConfig,
    decode: Callable[[list[int]], str] | None = None,
) -> list[list[float]]:
    """One advantage per completion token: the episode's outcome advantage (lengths counted in
    the model's tokens), or (`process`) from per-step rewards, each step ending at a token."""
    lengths = [len(e.completion_ids) for e in episodes]
    if config.advantage.type != "process":
        model_tokens = [sum(e.turn_lengths) for e in episodes]
        outcome = group_advantages([r.reward for r in scored], model_tokens, config.advantage)
        return [[value] * n for value, n in zip(outcome, lengths, strict=True)]
    steps = [step_ends(e, r, decode) for e, r in zip(episodes, scored, strict=True)]
    return process_advantages(steps, lengths)


def step_ends(
    episode: Episode, result: RewardResult, decode: Callable[[list[int]], str] | None
) -> list[tuple[int, float]]:
    """(token index where the step ends, reward) of each per-step reward. A single turn's steps
    end at character offsets of its text: the first token whose prefix decodes that far
    (`decode` skips special tokens, as the completion text does). An episode's end at a model
    turn's last token; a step naming a turn the episode does not have is dropped (reward
    workers refuse them, an env-server's included)."""
    if not episode.single_turn:
        ends = episode.turn_ends
        return [(ends[turn], reward) for turn, reward in result.steps if 0 <= turn < len(ends)]
    if decode is None:
        raise ValueError("process advantages need a tokenizer to map characters to tokens")
    offsets, total = [], 0
    for token in episode.completion_ids:  # character offset at the end of every token
        total += len(decode([token]))
        offsets.append(total)
    return [(bisect.bisect_left(offsets, end), reward) for end, reward in result.steps]


def episode_tokens(
    envs: list[Environment],
    names: list[str],
    tokenizer: PreTrainedTokenizerBase,
) -> EpisodeTokens | None:
    """The turn-by-turn tokenizer when an environment (trained or evaluated) is multi-turn,
    after checking that the chat template can append turns (a config error otherwise)."""
    multi_turn = [name for env, name in zip(envs, names, strict=True) if is_multi_turn(env)]
    if not multi_turn:
        return None
    tokens = EpisodeTokens(tokenizer)
    try:
        tokens.check()
    except SuffixError as error:
        raise ConfigError(f"env {multi_turn[0]}: {error}") from error
    return tokens
