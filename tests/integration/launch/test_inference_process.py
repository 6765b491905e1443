"""`inference_server`, which tests and benchmarks start their servers with: a port lost to a
neighbour between choosing it and binding it costs a restart, not a failed test; a server
that dies at start-up says why."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from asyncrl.launch import inference_process
from asyncrl.launch.inference_process import free_port, inference_server
from asyncrl.ports import RAY_WORKER_PORTS, ephemeral_range


def test_a_free_port_lies_below_the_range_the_kernel_hands_out_and_above_rays_workers() -> None:
    """Else a neighbour's connection may take it before the server binds it, and `ray start
    --port` refuses one among its workers' ports (CI at f019933 met both)."""
    first, _ = ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert all(port < first for port in ports)
    assert not [port for port in ports if port in RAY_WORKER_PORTS]


def test_a_port_taken_before_the_server_binds_it_is_replaced_by_a_fresh_one(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = int(squatter.getsockname()[1])
        choices: Iterator[int] = iter([taken, free_port()])
        monkeypatch.setattr(inference_process, "free_port", lambda: next(choices))
        log = tmp_path / "server.log"
        with inference_server(tiny_model_dir, "--max_model_len", "64", log_path=log) as url:
            assert not url.endswith(f":{taken}")
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        assert inference_process.PORT_TAKEN in log.read_text().lower()  # the first try's


def test_a_server_that_dies_at_start_up_shows_the_end_of_its_log(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with (
        pytest.raises(RuntimeError, match="exited with code") as raised,
        inference_server(missing, startup_timeout=120),
    ):
        pass
    assert "no-such-model" in str(raised.value)  # the server's own complaint, from its log
