"""Multi-turn episodes against the real server: the tokens the trainer sees are the ones the
server sampled and the environment's rendered messages, the trainer's logprobs equal the
server's on every model token, and an environment that fails mid-episode costs that episode."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs import load_environment
from asyncrl.envs.episode_tokens import EpisodeTokens
from asyncrl.envs.reward_pool import RewardPool
from asyncrl.orchestrator.buffer import Buffer
from asyncrl.orchestrator.client import ClientPool
from asyncrl.orchestrator.episode import EpisodeSetting, run_episode_group
from asyncrl.orchestrator.rollout import Group, GroupRequest
from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.micro_batches import build_micro_batches
from asyncrl.types import TrainingBatch

pytestmark = pytest.mark.integration

# earlier assistant turns shortened to 3 characters (as templates strip earlier reasoning):
# re-rendering an episode would change the model's tokens
REWRITING = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' and not loop.last %}{{ message['content'][:3] }}"
    "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def play_group(
    server_url: str, model: Path, tokenizer_dir: Path, env_id: str, env_args: dict,
    timeout: float = 30.0, seed: int = 3,
) -> tuple[Group, RewardPool]:  # fmt: skip
    config = OrchestratorConfig(
        model={"name": str(model)}, env=[{"id": env_id, "args": env_args}], batch_size=4,
        rollouts_per_example=4, seq_len=200, sampling={"max_tokens": 6, "temperature": 1.0},
        client={"base_url": [f"{server_url}/v1"]},
    )  # fmt: skip
    env = load_environment(env_id, env_args)
    tokens = EpisodeTokens(AutoTokenizer.from_pretrained(tokenizer_dir))

    async def scenario() -> tuple[Group, RewardPool]:
        clients = ClientPool(config.client)
        await clients.start(str(model))
        pool = RewardPool(env_id, env_args, env.rubric, num_workers=1, timeout=timeout)
        await pool.start()
        request = GroupRequest(Buffer([env], config.buffer, 0, 8).draw(), env_id, str(model),
                               1.0, seed, launch_version=0)  # fmt: skip
        try:
            setting = EpisodeSetting(config, clients, pool, tokens, env.max_turns)
            group = await run_episode_group(request, setting, vocab_size=128)
            # the pool still answers after whatever the environment did
            assert await pool.score([{"role": "user", "content": "x"}], request.drawn.example)
        finally:
            await pool.close()
            await clients.close()
        return group, pool

    return asyncio.run(scenario())


def runs(mask: list[bool]) -> list[tuple[bool, int, int]]:
    """(masked value, start, end) of each stretch of equal mask values."""
    found, start = [], 0
    for index in range(1, len(mask) + 1):
        if index == len(mask) or mask[index] != mask[start]:
            found.append((mask[start], start, index))
            start = index
    return found


# `<unk>`: the EOS moved off the token the template closes a turn with (Gemma 3's instruction-
# tuned template closes with `<end_of_turn>`, its EOS is `<eos>`): turns still close as rendered
@pytest.mark.parametrize("eos_token", [None, "<unk>"])
def test_episodes_are_the_servers_tokens_and_the_trainer_agrees_on_every_model_token(
    server_url: str, tiny_model_dir: Path, tmp_path: Path, eos_token: str | None
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = REWRITING
    closing = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if eos_token is not None:
        tokenizer.eos_token = eos_token
    tokenizer.save_pretrained(tmp_path / "rewriting")
    env = load_environment("guess-number", {"max_turns": 4})
    group, _ = play_group(server_url, tiny_model_dir, tmp_path / "rewriting", "guess-number",
                          {"max_turns": 4})  # fmt: skip

    assert max(group.turns) >= 2 and sum(group.turns) == len(group.turn_lengths)
    rewritten, trained_turns = 0, []
    for sample in group.samples:
        assert sample.problems() == [] and len(sample.completion_ids) > 0
        stretches = runs(sample.completion_mask)
        model_turns = [sample.completion_ids[a:b] for trained, a, b in stretches if trained]
        # the mask covers exactly the model's tokens; between two turns is the end-of-turn
        # token if the model did not sample it (a turn cut by max_tokens), then exactly the
        # environment's answer as the template renders it
        conversation = [*group.drawn.example.prompt]
        expected = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
        expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
        for index, turn in enumerate(model_turns):
            expected += turn
            text = tokenizer.decode(turn, skip_special_tokens=True)
            conversation.append({"role": "assistant", "content": text})
            if index < len(model_turns) - 1:
                if turn[-1] != closing:
                    expected.append(closing)
                reply = env.respond(conversation, group.drawn.example)
                conversation += reply.messages
                rendered = "".join(
                    f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in reply.messages
                )
                expected += tokenizer("\n" + rendered + "<|im_start|>assistant\n",
                                      add_special_tokens=False)["input_ids"]  # fmt: skip
        assert sample.prompt_ids + sample.completion_ids == expected
        trained_turns += [len(turn) for turn in model_turns]
        naive = tokenizer.apply_chat_template(conversation)
        naive = list(naive["input_ids"] if hasattr(naive, "keys") else naive)
        rewritten += naive[: len(expected)] != expected
    assert trained_turns == group.turn_lengths  # every sampled token trained, nothing else
    assert rewritten > 0  # re-rendering would have changed earlier tokens in some episode

    batch = TrainingBatch(step=1, samples=group.samples)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    micro_batches = build_micro_batches(batch, 256, 64, 0, "token", shared_prefix=True)
    with torch.no_grad():
        trainer = torch.cat(
            [completion_logprobs(model, mb.packed, mb.temperature).logprobs for mb in micro_batches]
        )
    served = torch.cat([mb.inference_logprobs for mb in micro_batches])
    assert trainer.numel() == sum(sum(s.completion_mask) for s in group.samples)
    assert float((trainer - served).abs().max()) <= 1e-5


FLAKY = """
import time

from asyncrl.envs.base import Example, RewardFunction
from asyncrl.envs.multi_turn import Reply


class Flaky:
    name = "flaky"
    max_turns = 4

    def __init__(self, mode):
        self.mode = mode
        self.rubric = [RewardFunction("one", lambda messages, example: 1.0)]

    def examples(self, split, count):
        return [Example(i, [{"role": "user", "content": "go"}], "", "flaky") for i in range(count)]

    def respond(self, messages, example):
        if sum(m["role"] == "assistant" for m in messages) == 1:
            return Reply([{"role": "user", "content": "again"}])
        if self.mode == "crash":
            raise RuntimeError("the sandbox fell over")
        if self.mode == "hang":
            time.sleep(60)
        if self.mode == "exit":
            import os
            os._exit(3)
        return {"not": "a reply"}


def load_environment(mode):
    return Flaky(mode)
"""


@pytest.mark.parametrize(
    ("mode", "ended_by"),
    [("crash", "env_error"), ("hang", "env_timeout"), ("exit", "env_worker_died"),
     ("bad_reply", "env_error")],
)  # fmt: skip
def test_an_environment_failing_mid_episode_costs_that_episode_only(
    mode: str, ended_by: str, server_url: str, tiny_model_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    (tmp_path / "failing_turns_env.py").write_text(FLAKY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    group, pool = play_group(server_url, tiny_model_dir, tiny_model_dir, "me/failing-turns-env",
                             {"mode": mode}, timeout=2.0)  # fmt: skip
    # every episode got past its first turn (the model stopped) or ended there cut short
    reached = [t for t in group.turns if t == 2]
    assert group.episode_ends[ended_by] == len(reached) > 0
    for sample, turns, reward in zip(group.samples, group.turns, group.rewards, strict=True):
        if turns == 2:  # failed on its second answer: scored 0, nothing trained
            assert reward == 0.0 and not any(sample.completion_mask)
        else:
            assert reward == 1.0 and any(sample.completion_mask)
    assert pool.failures[ended_by] == len(reached)
