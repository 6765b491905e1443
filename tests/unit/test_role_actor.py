"""The Ray actor's own logic, run as a plain object here (Ray only makes it remote): it runs the
role's real command, hands its log out in pieces, and tells shared storage from node-local."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.launch.role_actor import RoleActor


@pytest.fixture(autouse=True)
def _remove_scratch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every actor made here is cleaned up after its test, as the driver does before killing
    one: each makes a scratch directory under the system's temporary directory."""
    made: list[RoleActor] = []
    original = RoleActor.__init__

    def init_and_remember(self: RoleActor, label: str) -> None:
        original(self, label)
        made.append(self)

    monkeypatch.setattr(RoleActor, "__init__", init_and_remember)
    yield
    for actor in made:
        actor.cleanup()


def test_probes_are_seen_only_where_the_directory_is_shared(tmp_path: Path) -> None:
    first, second = RoleActor("infer-0"), RoleActor("orch")
    shared = str(tmp_path / "shared")
    assert first.write_probe(shared, "a1") is None
    assert second.write_probe(shared, "b2") is None
    assert first.missing_probes(shared, {"infer-0": "a1", "orch": "b2"}) == []
    # a node whose `shared` is another directory sees neither file
    elsewhere = str(tmp_path / "node_local")
    assert second.missing_probes(elsewhere, {"infer-0": "a1", "orch": "b2"}) == ["infer-0", "orch"]
    # a stale probe from an earlier run does not count
    assert first.missing_probes(shared, {"infer-0": "other"}) == ["infer-0"]


def test_an_unwritable_run_directory_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert "cannot write" in str(RoleActor("orch").write_probe(str(blocker / "probe"), "x"))


def test_the_role_runs_its_real_command_and_its_log_comes_out_in_order(tmp_path: Path) -> None:
    actor = RoleActor("orch")
    assert actor.poll() is None and actor.read_log(0) == (b"", 0)
    pid = actor.start("orch", "not_a_key: 1\n", str(tmp_path / "configs" / "orch.yaml"), {},
                      str(tmp_path))  # fmt: skip
    assert pid > 0
    deadline = time.monotonic() + 60
    while actor.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert actor.poll() == 2  # `asyncrl orch` refuses the config, as it would by hand
    head, offset = actor.read_log(0)
    rest, end = actor.read_log(offset)
    assert rest == b"" and end == offset
    assert b"not_a_key" in head
    assert (tmp_path / "configs" / "orch.yaml").read_text() == "not_a_key: 1\n"
    assert actor.stop() == 2


def test_ports_asked_together_are_distinct_and_bindable() -> None:
    import socket

    ports = RoleActor("train-0").free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("", port))


def test_a_restart_runs_the_first_command_plus_the_resume_arguments(tmp_path: Path) -> None:
    actor = RoleActor("orch")
    first = actor.start("orch", "not_a_key: 1\n", str(tmp_path / "orch.yaml"), {}, str(tmp_path))
    while actor.status()[0] is None:
        time.sleep(0.1)
    assert actor.status() == (2, None)  # a config error; the role never got to beat
    second = actor.restart(["--also_not_a_key", "3"])
    assert second != first
    while actor.poll() is None:
        time.sleep(0.1)
    log = actor.read_log(0)[0].decode()
    assert log.count("not_a_key") >= 2 and "also_not_a_key" in log


def test_ports_are_chosen_where_the_kernel_never_hands_one_out() -> None:
    """Outside the ephemeral range, no outgoing connection (or bind 0) of this node can take a
    port between its choice and the role's bind, or while the role restarts."""
    first, last = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
                   .split())  # fmt: skip
    ports = RoleActor("train-0").free_ports(4)
    assert len(set(ports)) == 4
    assert not [port for port in ports if first <= port <= last]


def test_cleanup_leaves_no_scratch_directory(tmp_path: Path) -> None:
    actor = RoleActor("orch")
    actor.start("orch", "not_a_key: 1\n", str(tmp_path / "orch.yaml"), {}, str(tmp_path))
    while actor.poll() is None:
        time.sleep(0.1)
    scratch = actor.log_path.parent
    assert (scratch / "role.log").exists()
    actor.cleanup()
    assert not scratch.exists()


def test_the_probes_leave_no_directory_behind(tmp_path: Path) -> None:
    from asyncrl.launch.shared_storage import probe_dir, remove_probes

    actors = [RoleActor("infer-0"), RoleActor("orch")]
    probes = str(probe_dir(tmp_path, "run1"))
    for actor in actors:
        assert actor.write_probe(probes, actor.label) is None
    for actor in actors:
        actor.remove_probe(probes)
    remove_probes(tmp_path, "run1")
    assert list(tmp_path.iterdir()) == []


def test_killing_a_role_whose_group_is_already_gone_is_no_error() -> None:
    import os
    import signal

    import pytest

    from asyncrl.processes import kill_group, start

    process = start(["sleep", "30"], None)
    os.killpg(process.pid, signal.SIGKILL)
    os.waitpid(process.pid, 0)  # ended and reaped between a poll() and the kill
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # what the supervisor and the actor did
    kill_group(process)  # what they do now
