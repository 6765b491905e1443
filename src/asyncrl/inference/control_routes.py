"""The routes that run the server rather than generate: health and identity, weight and adapter
loading, pause and resume, the prefix cache, metrics. They follow vLLM's (and its RL
extensions') paths, so the orchestrator drives every engine the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from asyncrl import __version__
from asyncrl.inference import protocol
from asyncrl.inference.api_errors import APIError, error_response
from asyncrl.inference.metrics import render_metrics
from asyncrl.inference.served_model import ServedModel, WeightInfo
from asyncrl.inference.weights import WeightLoadError
from asyncrl.log import get_logger
from asyncrl.transport.weights.manifest import WeightsMismatch
from asyncrl.transport.weights.route import WeightIntake
from asyncrl.types import PauseMode

logger = get_logger(__name__)

LONGEST_WAIT_S = 30.0  # a long-polled /weight_info answers within this, changed or not


def open_router(served: ServedModel, receiver: WeightIntake | None) -> APIRouter:
    """Routes any client may call, key or not: /health, /version, /metrics."""
    router = APIRouter()

    @router.get("/health")
    async def health() -> JSONResponse:
        if served.engine.failure is not None:
            return error_response(503, f"engine failed: {served.engine.failure}",
                                  "ServiceUnavailable")  # fmt: skip
        if receiver is not None and receiver.error is not None:
            message = f"weight receiver failed: {receiver.error}"
            return error_response(503, message, "ServiceUnavailable")
        return JSONResponse({})

    @router.get("/version")
    async def version() -> dict[str, str]:
        """Tells clients which engine this is (vLLM answers the same route with its version)."""
        return {"version": __version__, "engine": "asyncrl"}

    @router.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(served.engine, served.name, served.weight_reloads))

    return router


def control_router(served: ServedModel) -> APIRouter:
    """Weights, adapters, pause and resume: behind the API key when there is one."""
    engine = served.engine
    router = APIRouter()

    async def weights_call(function: Callable[..., WeightInfo], *args: Any) -> dict[str, Any]:
        """A bad request is a 400; a load that broke inside the engine is a 422, not a 5xx:
        clients take a 5xx for a server that is down and retry it forever, while this load
        fails again each time (a LoRA delta on the wrong device did on the first GPU run)."""
        try:
            info = await asyncio.to_thread(function, *args)
        except WeightsMismatch as error:  # read twice, checked twice: not the trainer's weights
            raise APIError(409, str(error), "WeightsMismatch") from error
        except WeightLoadError as error:
            raise APIError(400, str(error)) from error
        except Exception as error:
            logger.exception("inference: loading weights failed")
            message = (
                f"loading weights failed in the engine ({type(error).__name__}: {error}); the "
                "served weights may be partly updated: restart this server"
            )
            raise APIError(422, message) from error
        return _info(info)

    @router.post("/update_weights")
    async def update_weights(body: protocol.UpdateWeightsRequest) -> dict[str, Any]:
        return await weights_call(served.update_weights, body.weight_dir, body.version)

    @router.post("/v1/load_lora_adapter")
    async def load_lora(
        body: protocol.LoadLoraRequest, version: int | None = None
    ) -> dict[str, Any]:
        return await weights_call(
            served.load_lora, body.lora_name, body.lora_path, body.load_inplace, version
        )

    @router.post("/v1/unload_lora_adapter")
    async def unload_lora(body: protocol.UnloadLoraRequest) -> dict[str, Any]:
        return await weights_call(served.unload_lora, body.lora_name)

    @router.get("/weight_info")
    async def weight_info(changed_from: int | None = None, wait: float = 0.0) -> dict[str, Any]:
        """With `changed_from` and `wait`: answers once the version is not `changed_from`, or
        after `wait` seconds (at most LONGEST_WAIT_S), whichever comes first."""
        if changed_from is not None and wait > 0:
            await served.version_change(changed_from, min(wait, LONGEST_WAIT_S))
        return _info(served.info())

    @router.post("/pause")
    async def pause(mode: PauseMode = "abort") -> dict[str, Any]:
        await asyncio.to_thread(engine.pause, mode)
        return {"is_paused": True, "mode": mode}

    @router.post("/resume")
    async def resume() -> dict[str, Any]:
        engine.resume()
        return {"is_paused": False}

    @router.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": engine.is_paused}

    @router.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, bool]:
        """vLLM's route: drop every cached prefix (a weight change does it by itself)."""
        await asyncio.to_thread(engine.run_exclusive, engine.forget_prefixes)
        return {"reset": True}

    return router


def _info(info: WeightInfo) -> dict[str, Any]:
    return {
        "version": info.version,
        "fingerprint": info.fingerprint,
        "verified": info.verified,
        "checksum": info.checksum,
        "dtype": info.dtype,
        "weight_reloads": info.weight_reloads,
        "loaded": info.loaded,
        "bytes_read": info.bytes_read,
        "weight_dir": info.weight_dir,
        "lora_name": info.lora_name,
        "quantization": info.quantization,
    }
