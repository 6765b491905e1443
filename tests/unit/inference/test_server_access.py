"""Issue 60 (5, 6): no inference route is open to the network without a key.

An inference server whose `host` other machines reach refuses to start without an API key,
whatever its backend (the embedded server used to start silently; vLLM's development routes
answered anyone). With a key, vLLM is handed asyncrl's guard as `--middleware`, which covers
every route (vLLM's own key covers `/v1` only), and its worker extension reloads weights only
from under `weight_roots`. Everything here is decided before any engine starts, so it is
tested without one; `tests/contract/test_vllm_access.py` checks the same on a real vLLM."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from asyncrl.config.base import ConfigError
from asyncrl.config.inference import InferenceConfig
from asyncrl.config.loading import validate_config
from asyncrl.config.rl import RLConfig
from asyncrl.inference.access import server_api_key
from asyncrl.inference.external_engine import (
    ENGINE_GUARD,
    engine_environment,
    serve_external,
    vllm_command,
    vllm_environment,
)
from asyncrl.inference.weight_roots import WeightLoadError
from asyncrl.transport.vllm_worker_extension import (
    WEIGHT_ROOTS_ENV,
    AsyncrlWorkerExtension,
    allowed_weights_dir,
)
from asyncrl.web.api_key import EngineKeyGuard

OFF_LOOPBACK = "0.0.0.0"


@pytest.fixture(autouse=True)
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VLLM_API_KEY", "MY_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("backend", ["embedded", "vllm", "sglang"])
def test_a_server_off_loopback_without_a_key_is_refused_naming_the_variable(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = InferenceConfig(model="m", backend=backend, host=OFF_LOOPBACK, api_key_var="MY_KEY")
    with pytest.raises(ConfigError, match=r"`host` 0\.0\.0\.0 serves other machines but \$MY_KEY"):
        server_api_key(config)
    assert server_api_key(InferenceConfig(model="m", backend=backend)) is None  # loopback
    monkeypatch.setenv("MY_KEY", "s3cret")
    assert server_api_key(config) == "s3cret"


def test_vllm_off_loopback_without_a_key_names_its_development_routes() -> None:
    config = InferenceConfig(model="m", backend="vllm", host="10.1.2.3")
    with pytest.raises(ConfigError, match=r"/collective_rpc runs any worker method"):
        server_api_key(config)


def test_the_embedded_server_is_refused_before_it_loads_a_model() -> None:
    """It used to load the model and serve the network with no key, silently."""
    from asyncrl.inference.server import serve

    config = InferenceConfig(model="/nonexistent/model", host=OFF_LOOPBACK)
    with pytest.raises(ConfigError, match="serves other machines but \\$VLLM_API_KEY is unset"):
        serve(config)


def test_vllm_is_refused_before_it_starts() -> None:
    """`asyncrl infer --backend vllm` on the network without a key used to start vLLM with its
    development routes open; now nothing starts (this interpreter has no vLLM: had it tried
    to start one, the error would be vLLM's exit, not this)."""
    config = InferenceConfig(
        model="m", backend="vllm", executable=sys.executable, host=OFF_LOOPBACK
    )
    with pytest.raises(ConfigError, match="serves other machines"):
        serve_external(config)


@pytest.mark.parametrize(
    ("flag", "refused"),
    [
        ("--host", "--host"),
        ("--host=0.0.0.0", "--host"),
        ("--api-key", "--api-key"),
        ("--api_key", "--api-key"),
        ("--api_key=secret", "--api-key"),
    ],
)
def test_extra_args_cannot_rebind_the_engine_or_put_a_key_on_its_command_line(
    flag: str, refused: str
) -> None:
    config = InferenceConfig(
        model="m", backend="vllm", executable=sys.executable, extra_args=[flag, "x"]
    )
    with pytest.raises(ConfigError, match=f"{refused} is refused"):
        serve_external(config)


def test_the_run_launcher_refuses_an_open_server_before_any_role_starts(tmp_path: Path) -> None:
    from asyncrl.launch.local import run_rl

    config = validate_config(RLConfig, {
        "model": "m", "output_dir": str(tmp_path / "out"), "deployment": "disaggregated",
        "inference": {"host": OFF_LOOPBACK},
    })  # fmt: skip
    with pytest.raises(ConfigError, match="serves other machines"):
        run_rl(config)
    assert not (tmp_path / "out").exists()


def test_with_a_key_vllm_is_started_behind_asyncrls_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    config = InferenceConfig(model="m", backend="vllm", host=OFF_LOOPBACK, api_key_var="MY_KEY")
    assert "--middleware" not in vllm_command(config)  # no key: loopback only, as refused above
    monkeypatch.setenv("MY_KEY", "s3cret")
    command = vllm_command(config)
    assert command[command.index("--middleware") + 1] == ENGINE_GUARD
    module, name = ENGINE_GUARD.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is EngineKeyGuard
    assert vllm_environment(config)["VLLM_API_KEY"] == "s3cret"
    assert "s3cret" not in " ".join(command)


def test_vllm_gets_neither_the_run_secret_nor_a_stray_inference_key() -> None:
    ours = {"ASYNCRL_RUN_SECRET": "run-secret-01234567", "VLLM_API_KEY": "other", "PATH": "/bin"}
    assert engine_environment({"VLLM_SERVER_DEV_MODE": "1"}, ours) == {
        "PATH": "/bin",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    configured = engine_environment({"VLLM_API_KEY": "s3cret"}, ours)
    assert configured["VLLM_API_KEY"] == "s3cret" and "ASYNCRL_RUN_SECRET" not in configured


def a_vllm_like_app() -> Any:
    """The shape of vLLM's app: `/v1` routes, development routes, /health, a websocket."""

    async def ok(_: Any) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def realtime(socket: WebSocket) -> None:
        await socket.accept()
        await socket.send_text("hello")
        await socket.close()

    routes = [
        Route(path, ok, methods=["GET", "POST"])
        for path in ("/v1/models", "/collective_rpc", "/pause", "/is_paused", "/sleep",
                     "/invocations", "/health", "/version", "/metrics")
    ]  # fmt: skip
    app = Starlette(routes=[*routes, WebSocketRoute("/v1/realtime", realtime)])
    app.add_middleware(EngineKeyGuard)  # as vLLM adds `--middleware` classes: no arguments
    return app


def test_the_guard_needs_the_key_on_every_route_but_the_probes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the issue saw on vLLM with VLLM_API_KEY set: /v1/models 401 without the key, but
    POST /collective_rpc 200 and GET /is_paused 200. Under the guard, all of them need it."""
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    client = TestClient(a_vllm_like_app())
    guarded = ["/v1/models", "/collective_rpc", "/pause", "/is_paused", "/sleep", "/invocations"]
    for path in guarded:
        assert client.post(path).status_code == 401, path
        assert client.post(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.post(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    for path in ("/health", "/version", "/metrics"):
        assert client.get(path).status_code == 200, path
    with pytest.raises(WebSocketDisconnect), client.websocket_connect("/v1/realtime"):
        pass
    with client.websocket_connect(
        "/v1/realtime", headers={"Authorization": "Bearer s3cret"}
    ) as socket:
        assert socket.receive_text() == "hello"


def test_the_guard_refuses_to_be_built_without_a_key() -> None:
    with pytest.raises(RuntimeError, match=r"\$VLLM_API_KEY is unset"):
        TestClient(a_vllm_like_app()).get("/health")


def weights(root: Path, name: str) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    save_file({"lm_head.weight": torch.ones(2, 2)}, directory / "model.safetensors")
    return directory


def test_vllm_is_told_its_weight_roots_resolved(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = InferenceConfig(model="m", backend="vllm", weight_roots=["outputs", "~"])
    roots = json.loads(vllm_environment(config)[WEIGHT_ROOTS_ENV])
    assert roots == [str(tmp_path.resolve() / "outputs"), str(Path.home().resolve())]


def test_the_worker_extension_reloads_only_from_under_the_weight_roots(tmp_path: Path) -> None:
    """Issue 60 (5): `asyncrl_reload_weights` read any path a caller named."""
    root, elsewhere = tmp_path / "outputs", tmp_path / "elsewhere"
    inside, outside = weights(root, "step_1"), weights(elsewhere, "poisoned")
    environ = {WEIGHT_ROOTS_ENV: json.dumps([str(root)])}
    assert allowed_weights_dir(str(inside), environ) == str(inside.resolve())
    refused = [
        str(outside),  # elsewhere
        str(root / ".." / "elsewhere" / "poisoned"),  # `..` out of the root
        str(root / "missing"),  # no such directory
    ]
    (root / "link").symlink_to(outside)  # a link inside that points out
    refused.append(str(root / "link"))
    sneaky = weights(root, "sneaky")
    (sneaky / "model-00002.safetensors").symlink_to(outside / "model.safetensors")
    refused.append(str(sneaky))  # a file inside that points out
    for path in refused:
        with pytest.raises(WeightLoadError):
            allowed_weights_dir(path, environ)
    with pytest.raises(WeightLoadError, match=r"is unset: .* a vLLM server started by hand needs"):
        allowed_weights_dir(str(inside), {})


class FakeWorker(AsyncrlWorkerExtension):
    """vLLM's worker, as far as the extension uses it."""

    def __init__(self) -> None:
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.float32))
        self.reloaded: list[list[str]] = []

    def reload_weights(self, weights_iterator: Any) -> None:
        self.reloaded.append([name for name, _ in weights_iterator])

    @property
    def model_runner(self) -> Any:  # type: ignore[override]
        class Runner:
            def get_model(self) -> object:
                return object()  # no tied head

        return Runner()


def test_a_refused_reload_leaves_vllms_weights_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "outputs"
    inside, outside = weights(root, "step_1"), weights(tmp_path / "elsewhere", "poisoned")
    monkeypatch.setenv(WEIGHT_ROOTS_ENV, json.dumps([str(root)]))
    worker = FakeWorker()
    with pytest.raises(WeightLoadError, match="outside the allowed weight roots"):
        worker.asyncrl_reload_weights(str(outside))
    assert worker.reloaded == []
    assert worker.asyncrl_reload_weights(str(inside))["tied"] is False
    assert worker.reloaded == [["lm_head.weight"]]


def test_an_extension_that_could_not_reload_says_so_at_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The orchestrator's start-up probe (`asyncrl_extension`) fails on a server started by hand
    without `$ASYNCRL_WEIGHT_ROOTS`, saying what to set: not at the first weight sync."""
    monkeypatch.delenv(WEIGHT_ROOTS_ENV, raising=False)
    with pytest.raises(WeightLoadError, match=r"\$ASYNCRL_WEIGHT_ROOTS is unset"):
        FakeWorker().asyncrl_extension()
    monkeypatch.setenv(WEIGHT_ROOTS_ENV, "not json")
    with pytest.raises(WeightLoadError, match="not a JSON list of directories"):
        FakeWorker().asyncrl_extension()
    monkeypatch.setenv(WEIGHT_ROOTS_ENV, json.dumps(["/abs/outputs"]))
    assert FakeWorker().asyncrl_extension().endswith("AsyncrlWorkerExtension")
