"""Issue 60 (4), issue 86 (3): the processes that run a user's code for the run (reward workers,
the tools they call, scorer plugins and reward models) start without the run's secret and keys,
and without the user's own credentials unless the config passes one through. Each test starts
the real process the orchestrator starts, holding every such secret, and asks the user's code
what it finds in its environment."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from asyncrl import run_secret, user_code
from asyncrl.config.model_rewards import PluginTermConfig
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.envs import load_environment
from asyncrl.envs.model_rewards.items import ScoreItem
from asyncrl.envs.model_rewards.scorer_process import ScorerProcess
from asyncrl.envs.reward_pool import RewardPool

pytestmark = pytest.mark.integration

# what a careless (or model-written) piece of reward code could read and send anywhere
SECRETS = {
    "ASYNCRL_RUN_SECRET": "the-run-secret-0123456789abcdef",
    "VLLM_API_KEY": "the-inference-key",
    "ASYNCRL_ENV_API_KEY": "the-env-server-key",
    "RAY_AUTH_TOKEN": "the-ray-token",
    "MY_INFERENCE_KEY": "a-configured-inference-key",
    "MY_JUDGE_KEY": "a-configured-judge-key",
}
# the user's own credentials: out unless passed through by name (issue 86, 3)
CREDENTIALS = {
    "HF_TOKEN": "hf_the-users-token",
    "WANDB_API_KEY": "the-wandb-key",
    "AWS_SECRET_ACCESS_KEY": "the-aws-secret",
    "OPENAI_API_KEY": "sk-the-openai-key",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
}
# an allowlisted place, and a setting the config passes through
KEPT = {"HF_HOME": "/somewhere/hf", "MY_OWN_SETTING": "kept"}

USER_CODE = """
import json, os, subprocess, sys
from asyncrl.envs.base import Example, RewardFunction

def seen():
    # what the reward itself sees, and what a tool or program it starts sees
    program = "import os, json; print(json.dumps(dict(os.environ)))"
    child = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                           check=True).stdout
    return {"own": dict(os.environ), "child": json.loads(child)}

class PeekingEnv:
    name = "peeking"

    def __init__(self, report):
        self.report = report
        self.rubric = [RewardFunction("peek", self.peek)]

    def peek(self, completion, example):
        with open(self.report, "w") as handle:
            json.dump(seen(), handle)
        return 1.0

    def examples(self, split, count):
        return [Example(example_id=0, prompt=[{"role": "user", "content": "x"}], answer="a",
                        task="t")]

def load_environment(report):
    return PeekingEnv(report)

def scorer(report):
    def score(items):
        with open(report, "w") as handle:
            json.dump(seen(), handle)
        return [1.0 for _ in items]
    return score
"""


@pytest.fixture
def holding_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process holds every secret, as an orchestrator does; the user's module `peeking`
    is importable by the processes it starts. Yields where the user's code reports."""
    (tmp_path / "peeking.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    for name, value in {**SECRETS, **CREDENTIALS, **KEPT}.items():
        monkeypatch.setenv(name, value)
    # the orchestrator names the variables its config holds keys in (restored afterwards)
    monkeypatch.setattr(run_secret, "_withheld", set(run_secret._withheld))
    config = OrchestratorConfig.model_validate({
        "model": {"name": "m"}, "client": {"api_key_var": "MY_INFERENCE_KEY"},
        "reward_env_passthrough": ["MY_OWN_SETTING"],
        "env": [{"id": "reverse-text", "model_rewards": [
            {"type": "judge", "base_url": "http://127.0.0.1:9/v1", "api_key_var": "MY_JUDGE_KEY"}
        ]}],
    })  # fmt: skip
    run_secret.withhold(*config.secret_variables())
    user_code.pass_through(*config.reward_env_passthrough)
    return tmp_path / "report.json"


def assert_withheld(report: Path) -> None:
    seen = json.loads(report.read_text())
    for where in ("own", "child"):
        environment = seen[where]
        assert not set(SECRETS) & set(environment), f"{where}: {set(SECRETS) & set(environment)}"
        assert not set(SECRETS.values()) & set(environment.values())
        credentials = set(CREDENTIALS) & set(environment)
        assert not credentials, f"{where}: {credentials}"
        assert {name: environment.get(name) for name in KEPT} == KEPT


def test_a_reward_worker_and_what_it_starts_hold_no_secret(holding_secrets: Path) -> None:
    async def scenario() -> None:
        args = {"report": str(holding_secrets)}
        env = load_environment("someone/peeking", args)
        pool = RewardPool("someone/peeking", args, env.rubric, num_workers=1, timeout=60)
        await pool.start()
        try:
            result = await pool.score("a", env.examples("train", 1)[0])
            assert result.reward == 1.0 and not result.failed and result.lost is None
        finally:
            await pool.close()

    asyncio.run(scenario())
    assert_withheld(holding_secrets)


def test_a_scorer_plugin_and_what_it_starts_hold_no_secret(holding_secrets: Path) -> None:
    async def scenario() -> None:
        term = ScorerProcess(
            PluginTermConfig(import_path="peeking:scorer", args={"report": str(holding_secrets)})
        )
        await term.start()
        try:
            judged = await term.score(ScoreItem([{"role": "user", "content": "x"}], "a", "a", "t"))
            assert judged.value == 1.0
        finally:
            await term.close()

    asyncio.run(scenario())
    assert_withheld(holding_secrets)
