"""`asyncrl rl` hands every role the run's secret, the same for all, made afresh when unset,
so the channels between roles (zmq, the torch stores) are authenticated whatever the config."""

from __future__ import annotations

import sys
from pathlib import Path

from asyncrl.config.loading import load_config
from asyncrl.config.restart import RestartConfig
from asyncrl.config.rl import RLConfig
from asyncrl.launch.local import role_specs, write_role_configs
from asyncrl.launch.supervisor import RoleSpec, SupervisedRole


def specs(tmp_path: Path) -> dict[str, RoleSpec]:
    config = load_config(RLConfig, [], ["--model", "m", "--output_dir", str(tmp_path / "out")])
    return role_specs(config, write_role_configs(config, tmp_path), tmp_path)


def test_every_role_gets_one_fresh_secret_per_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ASYNCRL_RUN_SECRET", raising=False)
    first = {role: spec.env.get("ASYNCRL_RUN_SECRET") for role, spec in specs(tmp_path).items()}
    assert set(first) == {"infer", "orch", "train"}
    assert len(set(first.values())) == 1 and len(next(iter(first.values())) or "") >= 32
    second = {spec.env["ASYNCRL_RUN_SECRET"] for spec in specs(tmp_path).values()}
    assert second != set(first.values())  # another run, another secret


def test_a_secret_the_user_set_is_the_one_every_role_gets(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ASYNCRL_RUN_SECRET", "chosen-by-the-user-0123456789")
    spec = specs(tmp_path)["orch"]
    shown = tmp_path / "seen"
    program = f"import os; open({str(shown)!r}, 'w').write(os.environ['ASYNCRL_RUN_SECRET'])"
    role = SupervisedRole(
        RoleSpec("orch", [sys.executable, "-c", program], [], spec.log, spec.heartbeat, spec.env),
        RestartConfig(),
    )
    role.process.wait(timeout=60)
    assert shown.read_text() == "chosen-by-the-user-0123456789"
