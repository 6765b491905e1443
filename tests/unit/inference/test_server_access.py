"""Issue 60 (5, 6), issue 86 (1, 4): no inference route is open without a key.

An inference server whose `host` other machines reach refuses to start without an API key,
whatever its backend (the embedded server used to start silently; vLLM's development routes
answered anyone); a run's servers always have one, derived from the run's secret, loopback
included. With a key, vLLM is handed asyncrl's guard as `--middleware`, which covers every
route (vLLM's own key covers `/v1` only), the key reaching the guard over a socket, not in
vLLM's environment; its worker extension reloads weights only from under `weight_roots`. The
guard is tested here in a process of its own, as vLLM's builds it; everything else is decided
before any engine starts, so it is tested without one; `tests/contract/test_vllm_access.py`
checks the same on a real vLLM."""

from __future__ import annotations

import importlib
import json
import re
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
    refuse_flags_that_open,
    serve_external,
    vllm_command,
    vllm_environment,
)
from asyncrl.inference.weight_roots import WeightLoadError
from asyncrl.run_secret import server_key
from asyncrl.transport.vllm_worker_extension import (
    WEIGHT_ROOTS_ENV,
    AsyncrlWorkerExtension,
    allowed_weights_dir,
)
from asyncrl.web.api_key import EngineKeyGuard

OFF_LOOPBACK = "0.0.0.0"


@pytest.fixture(autouse=True)
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VLLM_API_KEY", "MY_KEY", "ASYNCRL_RUN_SECRET"):
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
        # issue 86 (4): argparse takes a flag's unambiguous prefix, and a Unix socket binds too
        ("--hos", "--hos (short for --host)"),
        ("--ho=0.0.0.0", "--ho (short for --host)"),
        ("--uds", "--uds"),
        ("--ud=/tmp/engine.sock", "--ud (short for --uds)"),
        ("--api-k", "--api-k (short for --api-key)"),
    ],
)
def test_extra_args_cannot_rebind_the_engine_or_put_a_key_on_its_command_line(
    flag: str, refused: str
) -> None:
    config = InferenceConfig(
        model="m", backend="vllm", executable=sys.executable, extra_args=[flag, "x"]
    )
    with pytest.raises(ConfigError, match=re.escape(f"{refused} is refused")):
        serve_external(config)


def test_flags_that_only_share_a_beginning_with_a_refused_one_pass() -> None:
    config = InferenceConfig(model="m", backend="vllm", extra_args=[
        "--api-server-count", "1", "--hf-overrides", "{}", "--uvicorn-log-level", "info",
    ])  # fmt: skip
    refuse_flags_that_open(config)


@pytest.mark.parametrize("host", ["127.0.0.1", OFF_LOOPBACK])
def test_every_server_of_a_run_is_keyed_by_its_secret_loopback_included(
    tmp_path: Path, host: str
) -> None:
    """A local run's server used to take no key on loopback (only a Ray cluster made one), and
    one off loopback was refused. Now every role holds the run's secret, and server and clients
    derive the same key from it, different per variable and per run; a key the user set wins."""
    from asyncrl.launch.roles import run_keys

    config = validate_config(RLConfig, {
        "model": "m", "output_dir": str(tmp_path / "out"), "deployment": "disaggregated",
        "inference": {"host": host},
    })  # fmt: skip
    keys = run_keys(config)
    served = server_api_key(config.inference, keys)
    assert served is not None and len(served) == 64 and served not in keys.values()
    assert server_key(config.orchestrator.client.api_key_var, keys) == served  # the client's
    assert server_key("ANOTHER_KEY_VAR", keys) != served
    assert server_api_key(config.inference, run_keys(config)) != served  # another run
    assert server_api_key(config.inference, {**keys, "VLLM_API_KEY": "chosen"}) == "chosen"


def test_with_a_key_vllm_is_started_behind_asyncrls_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    config = InferenceConfig(model="m", backend="vllm", host=OFF_LOOPBACK, api_key_var="MY_KEY")
    assert "--middleware" not in vllm_command(config)  # no key: loopback only, as refused above
    for key in ({"MY_KEY": "s3cret"}, {"ASYNCRL_RUN_SECRET": "a-runs-secret-0123456789"}):
        with monkeypatch.context() as patched:
            for name, value in key.items():
                patched.setenv(name, value)
            command = vllm_command(config)
            assert command[command.index("--middleware") + 1] == ENGINE_GUARD
            assert not set(key.values()) & set(" ".join(command).split())
            assert not {"MY_KEY", "VLLM_API_KEY", "ASYNCRL_RUN_SECRET"} & set(
                vllm_environment(config)
            )  # the key goes over a socket (`serve_external`)
    module, name = ENGINE_GUARD.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is EngineKeyGuard


def test_vllm_gets_neither_the_run_secret_nor_a_stray_inference_key() -> None:
    ours = {"ASYNCRL_RUN_SECRET": "run-secret-01234567", "VLLM_API_KEY": "other", "PATH": "/bin",
            "ASYNCRL_SECRETS_FD": "7"}  # fmt: skip
    assert engine_environment({"VLLM_SERVER_DEV_MODE": "1"}, ours) == {
        "PATH": "/bin",
        "VLLM_SERVER_DEV_MODE": "1",
    }


GUARD_IN_ITS_OWN_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_server_access import a_vllm_like_app
from starlette.testclient import TestClient
from asyncrl.process_privacy import is_dumpable
client = TestClient(a_vllm_like_app())
print(json.dumps({
    "without": client.post("/is_paused").status_code,
    "with": client.post("/is_paused", headers={"Authorization": "Bearer s3cret"}).status_code,
    "dumpable": is_dumpable(),
    "environ": open("/proc/self/environ", "rb").read().decode(errors="replace"),
}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_the_guard_in_vllms_process_gets_its_key_on_a_socket_not_in_its_environment(
    tmp_path: Path,
) -> None:
    """`asyncrl infer` used to hand vLLM the key in `$VLLM_API_KEY`, readable for the server's
    whole life in `/proc/<pid>/environ` by every process of its user, reward code included."""
    from asyncrl.processes import start

    here = str(Path(__file__).parent)
    out = tmp_path / "out.json"
    process = start([sys.executable, "-c", GUARD_IN_ITS_OWN_PROCESS, here], out,
                    keys={"VLLM_API_KEY": "s3cret"})  # fmt: skip
    assert process.wait(timeout=120) == 0, out.read_text()[-2000:]
    seen = json.loads(out.read_text().strip().splitlines()[-1])
    assert (seen["without"], seen["with"]) == (401, 200)
    assert seen["dumpable"] is False  # marked before it read the key
    assert "s3cret" not in seen["environ"] and "VLLM_API_KEY" not in seen["environ"]


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
