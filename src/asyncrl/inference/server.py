"""`asyncrl infer`: the OpenAI-compatible HTTP server (FastAPI) in front of the embedded engine.

Routes follow vLLM's: /v1/completions, /v1/chat/completions, /v1/models, /tokenize
(`openai_routes.py`); /health, /version, /metrics, /update_weights, /v1/load_lora_adapter,
/v1/unload_lora_adapter, /pause, /resume, /is_paused, /weight_info (`control_routes.py`). Every
bad request gets a 4xx with a message; the server keeps serving.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.base import ConfigError
from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.access import log_access, server_api_key
from asyncrl.inference.api_errors import APIError, error_response
from asyncrl.inference.control_routes import control_router, open_router
from asyncrl.inference.dtype import serving_dtype
from asyncrl.inference.engine import Engine
from asyncrl.inference.input_major import lay_out_input_major
from asyncrl.inference.int8_linears import QUANTIZE_HEAD, use_int8_linears
from asyncrl.inference.kv_cache import default_budget, slot_bytes
from asyncrl.inference.openai_routes import openai_router
from asyncrl.inference.served_model import ServedModel
from asyncrl.log import get_logger
from asyncrl.precision import default_device
from asyncrl.transport.weights.manifest import dtype_name
from asyncrl.transport.weights.registry import open_intake
from asyncrl.transport.weights.route import WeightIntake
from asyncrl.web.api_key import ApiKeyGuard
from asyncrl.web.body_limit import BodySizeLimit
from asyncrl.web.server_instance import ServerInstance

logger = get_logger(__name__)


def load_served_model(config: InferenceConfig, input_major: bool = True) -> ServedModel:
    """The server's model and engine. `input_major`: its CPU float32 linears kept input-major
    (`input_major.py`); a colocated engine keeps the loaded layout, since it takes a trainer's
    tensors in every step (shared, or copied in and fingerprinted on its thread). With
    `quantization: int8` the linears compute from int8 copies (`int8_linears.py`) and their
    float weights, which no pass reads, keep the loaded layout."""
    tokenizer = AutoTokenizer.from_pretrained(
        config.model, trust_remote_code=config.trust_remote_code
    )
    overrides: dict[str, Any] = {"rope_scaling": config.rope_scaling} if config.rope_scaling else {}
    dtype = serving_dtype(config)
    model = AutoModelForCausalLM.from_pretrained(
        config.model,
        dtype=dtype,
        trust_remote_code=config.trust_remote_code,
        attn_implementation="sdpa",
        **overrides,
    ).to(default_device())
    if config.quantization == "int8":
        quantize_linears(model, dtype)
    elif input_major:
        lay_out_input_major(model)
    max_model_len = config.max_model_len or int(model.config.max_position_embeddings)
    engine = Engine(
        model,
        tokenizer,
        max_num_seqs=slots_that_fit(config, model, max_model_len, dtype),
        max_model_len=max_model_len,
        max_num_batched_tokens=config.max_num_batched_tokens,
        prefix_caching=bool(config.enable_prefix_caching),
    )
    return ServedModel(
        engine,
        name=config.served_model_name or config.model,
        weight_roots=config.weight_roots,
        enable_lora=config.enable_lora,
        max_lora_rank=config.max_lora_rank,
    )


def quantize_linears(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """`quantization: int8`: the model's linear layers in int8, the LM head too where that
    measured faster (`int8_linears.QUANTIZE_HEAD`); CPU engines only."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(
            f"inference.quantization int8 is built for a CPU engine, not {device}; on a GPU "
            "serve with `backend: vllm` and its own `--quantization` in `extra_args`"
        )
    count = use_int8_linears(model, head=QUANTIZE_HEAD)
    logger.info(
        "inference: %d linear layers (the LM head %s) multiply int8 weights, one scale per "
        "output channel, by int8 activations, one scale per row (torch._int_mm); the rest of "
        "the model in %s", count, "among them" if QUANTIZE_HEAD else "not",
        str(dtype).removeprefix("torch."),
    )  # fmt: skip


def slots_that_fit(
    config: InferenceConfig, model: torch.nn.Module, max_model_len: int, dtype: torch.dtype
) -> int:
    """`max_num_seqs`, or fewer where that many slots of `max_model_len` positions would pass the
    KV cache budget (a model's own context, 8,192 for SmolLM2, makes a slot 377 MB)."""
    per_slot = slot_bytes(model.config, max_model_len, dtype)
    budget = config.kv_cache_memory_bytes or default_budget(torch.device(default_device()))
    slots = min(config.max_num_seqs, budget // per_slot)
    if slots < 1:
        raise ConfigError(
            f"inference: one KV cache slot of max_model_len {max_model_len} takes "
            f"{per_slot / 2**20:.0f} MiB, over the {budget / 2**20:.0f} MiB budget; lower "
            "`max_model_len` or raise `kv_cache_memory_bytes`"
        )
    if slots < config.max_num_seqs:
        logger.warning(
            "inference: max_num_seqs %d lowered to %d: each slot of max_model_len %d takes "
            "%.0f MiB and the KV cache budget is %.0f MiB (set max_model_len, or "
            "kv_cache_memory_bytes)", config.max_num_seqs, slots, max_model_len,
            per_slot / 2**20, budget / 2**20,
        )  # fmt: skip
    return int(slots)


def build_app(
    config: InferenceConfig, served: ServedModel, receiver: WeightIntake | None = None
) -> FastAPI:
    """The app: the API key on every route but /health, /version and /metrics (checked first;
    no key: refused off loopback), request-size and read-time limits, OpenAI-shaped errors,
    and the two groups of routes."""
    api_key = server_api_key(config)  # none: refused off loopback (`access.py`)
    app = FastAPI(title="asyncrl inference", docs_url=None, redoc_url=None)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=config.max_request_bytes,
        read_timeout=config.request_read_timeout,
    )
    if api_key is not None:  # added last: runs first
        app.add_middleware(ApiKeyGuard, api_key=api_key)
    app.add_middleware(ServerInstance)  # outermost: refusals say which start of the server too

    @app.exception_handler(APIError)
    async def _api_error(_: Request, error: APIError) -> JSONResponse:
        return error_response(error.status, error.message, error.kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = []
        for item in error.errors():
            where = ".".join(str(part) for part in item["loc"] if part != "body")
            problems.append(f"{where}: {item['msg'].removeprefix('Value error, ')}".strip(": "))
        return error_response(400, "; ".join(problems) or "invalid request", "BadRequestError")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), "HTTPError")

    app.include_router(open_router(served, receiver))
    app.include_router(openai_router(config, served))
    app.include_router(control_router(served))
    return app


class EngineFailed(RuntimeError):
    """The engine gave up (its steps kept failing): the server stopped rather than abort every
    request behind a healthy /health."""


class ClosingServer(uvicorn.Server):
    """On SIGTERM/SIGINT, also end the engine's requests (held by a pause ones too), so the
    graceful shutdown has nothing to wait for; `on_exit` runs on a thread of its own, not in
    the signal handler."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        threading.Thread(target=self.on_exit, name="asyncrl-close", daemon=True).start()


def serve(config: InferenceConfig) -> None:
    """Load the model, start the engine and serve until interrupted; refused at once off
    loopback without an API key (`access.py`)."""
    log_access(config, server_api_key(config))
    served = load_served_model(config)
    receiver = open_intake(served, config)  # weights pushed by the trainer (NCCL, …), if so
    if receiver is not None:
        receiver.start()
    app = build_app(config, served, receiver)
    logger.info(
        "serving %s on http://%s:%d (max_num_seqs %d, max_model_len %d, %s, quantization %s)",
        served.name,
        config.host,
        config.port,
        config.max_num_seqs,
        served.engine.max_model_len,
        dtype_name(served.served_dtype),
        served.quantization,
    )
    server = ClosingServer(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            limit_concurrency=config.max_connections,
            timeout_graceful_shutdown=config.shutdown_timeout,
        ),
        on_exit=served.engine.close,
    )

    def stop_serving(_: str) -> None:  # the process exits non-zero: supervisors restart it
        server.should_exit = True

    served.engine.on_failure = stop_serving
    try:
        server.run()
    finally:
        if receiver is not None:
            receiver.stop()
        served.engine.shutdown()
    if served.engine.failure is not None:
        raise EngineFailed(f"the inference server stopped: {served.engine.failure}")
