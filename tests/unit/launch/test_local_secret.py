"""`asyncrl rl` hands every role the run's secret, the same for all, made afresh when unset,
so the channels between roles (zmq, the torch stores, the servers' keys) are authenticated
whatever the config; it hands it, and any key the user exported, over a socket or in memory,
never in a role's environment (issue 86, 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from asyncrl.config.loading import load_config
from asyncrl.config.restart import RestartConfig
from asyncrl.config.rl import RLConfig
from asyncrl.launch.local import role_specs, write_role_configs
from asyncrl.launch.supervisor import RoleSpec, SupervisedRole
from asyncrl.run_secret import withhold


def specs(tmp_path: Path) -> dict[str, RoleSpec]:
    config = load_config(RLConfig, [], ["--model", "m", "--output_dir", str(tmp_path / "out")])
    return role_specs(config, write_role_configs(config, tmp_path), tmp_path)


def test_every_role_gets_one_fresh_secret_per_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ASYNCRL_RUN_SECRET", raising=False)
    first = {role: spec.keys.get("ASYNCRL_RUN_SECRET") for role, spec in specs(tmp_path).items()}
    assert set(first) == {"infer", "orch", "train"}
    assert len(set(first.values())) == 1 and len(next(iter(first.values())) or "") >= 32
    second = {spec.keys["ASYNCRL_RUN_SECRET"] for spec in specs(tmp_path).values()}
    assert second != set(first.values())  # another run, another secret
    assert not any("ASYNCRL_RUN_SECRET" in spec.env for spec in specs(tmp_path).values())


# what an exec'd role finds: its keys, read off the socket, and its own /proc environ
ROLE = """
import json, os, sys
from asyncrl.secret_handover import receive_keys
keys = receive_keys()
with open(sys.argv[1], "w") as out:
    json.dump({"keys": keys, "environ": open("/proc/self/environ", "rb").read().decode(),
               "os_environ": dict(os.environ)}, out)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_secret_and_key_the_user_set_reach_an_execd_role_but_not_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCRL_RUN_SECRET", "chosen-by-the-user-0123456789")
    monkeypatch.setenv("VLLM_API_KEY", "exported-by-the-user")
    withhold("VLLM_API_KEY")  # what `run_rl` does first: out of the launcher's environment
    spec = specs(tmp_path)["orch"]
    assert spec.keys["ASYNCRL_RUN_SECRET"] == "chosen-by-the-user-0123456789"
    shown = tmp_path / "seen"
    role = SupervisedRole(
        RoleSpec("orch", [sys.executable, "-c", ROLE, str(shown)], [], spec.log, spec.heartbeat,
                 spec.env, keys=spec.keys),
        RestartConfig(),
    )  # fmt: skip
    assert role.process.wait(timeout=60) == 0, spec.log.read_text()[-2000:]
    seen = json.loads(shown.read_text())
    assert seen["keys"] == {"ASYNCRL_RUN_SECRET": "chosen-by-the-user-0123456789",
                            "VLLM_API_KEY": "exported-by-the-user"}  # fmt: skip
    for value in ("chosen-by-the-user-0123456789", "exported-by-the-user"):
        assert value not in seen["environ"] and value not in seen["os_environ"].values()
    assert "ASYNCRL_SECRETS_FD" not in seen["os_environ"]
