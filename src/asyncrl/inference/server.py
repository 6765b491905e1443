"""`asyncrl infer`: the OpenAI-compatible HTTP server (FastAPI) in front of the embedded engine.

Routes follow vLLM's: /v1/completions, /v1/chat/completions, /v1/models, /health, /tokenize,
/update_weights, /v1/load_lora_adapter, /v1/unload_lora_adapter, /pause, /resume, /is_paused,
/weight_info, /metrics. Every bad request gets a 4xx with a message; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl import __version__
from asyncrl.config.inference import InferenceConfig
from asyncrl.inference import protocol
from asyncrl.inference.body_limit import BodySizeLimit
from asyncrl.inference.dtype import serving_dtype
from asyncrl.inference.engine import Engine
from asyncrl.inference.metrics import render_metrics
from asyncrl.inference.served_model import ServedModel, WeightInfo
from asyncrl.inference.weight_receiver import WeightReceiverThread
from asyncrl.inference.weights import WeightLoadError
from asyncrl.log import get_logger
from asyncrl.types import PauseMode

logger = get_logger(__name__)


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "code": status}}
    )


def load_served_model(config: InferenceConfig) -> ServedModel:
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
    )
    max_model_len = config.max_model_len or int(model.config.max_position_embeddings)
    engine = Engine(
        model,
        tokenizer,
        max_num_seqs=config.max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
    return ServedModel(
        engine,
        name=config.served_model_name or config.model,
        weight_roots=config.weight_roots,
        enable_lora=config.enable_lora,
        max_lora_rank=config.max_lora_rank,
    )


def build_app(
    config: InferenceConfig, served: ServedModel, receiver: WeightReceiverThread | None = None
) -> FastAPI:
    engine = served.engine
    tokenizer = engine.tokenizer
    api_key = os.environ.get(config.api_key_var) or None
    app = FastAPI(title="asyncrl inference", docs_url=None, redoc_url=None)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_request_bytes)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, error: APIError) -> JSONResponse:
        return _error(error.status, error.message, error.kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = []
        for item in error.errors():
            where = ".".join(str(part) for part in item["loc"] if part != "body")
            problems.append(f"{where}: {item['msg'].removeprefix('Value error, ')}".strip(": "))
        return _error(400, "; ".join(problems) or "invalid request", "BadRequestError")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return _error(error.status_code, str(error.detail), "HTTPError")

    async def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "missing or wrong API key", "AuthenticationError")

    guarded = [Depends(authorize)]

    def resolve_model(name: str | None) -> None:
        if name is None:
            return
        if name not in served.model_names():
            raise APIError(404, f"The model `{name}` does not exist.", "NotFoundError")
        if name == served.name and served.adapter_name is not None:
            raise APIError(
                400,
                f"LoRA adapter `{served.adapter_name}` is merged into the weights; request it "
                "by name or unload it to serve the base model",
            )

    vocab_size = int(engine.model.config.vocab_size)

    def check_prompt(prompt_ids: list[int], max_tokens: int | None) -> int:
        """The token budget of a prompt, or a 400 saying why it cannot be served."""
        limit = engine.max_model_len
        if not prompt_ids:
            raise APIError(400, "the prompt is empty")
        if max(prompt_ids) >= vocab_size:
            raise APIError(
                400, f"prompt token id {max(prompt_ids)} >= vocabulary size {vocab_size}"
            )
        if len(prompt_ids) >= limit:
            raise APIError(400, f"prompt has {len(prompt_ids)} tokens; max_model_len is {limit}")
        if max_tokens is None:
            return limit - len(prompt_ids)
        if len(prompt_ids) + max_tokens > limit:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, "
                f"{max_tokens} in the completion).",
            )
        return max_tokens

    async def run(prompt_ids: list[int], params: Any, n: int) -> list[Any]:
        request = engine.submit(prompt_ids, params, n)
        try:
            return await asyncio.wrap_future(request.done)
        except asyncio.CancelledError:  # client went away: free its slots
            engine.abort(request)
            raise

    @app.get("/health")
    async def health() -> JSONResponse:
        if receiver is not None and receiver.error is not None:
            message = f"weight receiver failed: {receiver.error}"
            return _error(503, message, "ServiceUnavailable")
        return JSONResponse({})

    @app.get("/version")
    async def version() -> dict[str, str]:
        """Tells clients which engine this is (vLLM answers the same route with its version)."""
        return {"version": __version__, "engine": "asyncrl"}

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> dict[str, Any]:
        data = [
            {
                "id": name,
                "object": "model",
                "owned_by": "asyncrl",
                "root": config.model,
                "parent": None if name == served.name else served.name,
                "max_model_len": engine.max_model_len,
            }
            for name in served.model_names()
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(body: protocol.CompletionRequest) -> JSONResponse:
        resolve_model(body.model)
        prompts = [
            p if isinstance(p, list) else tokenizer(p, add_special_tokens=True)["input_ids"]
            for p in body.prompts()
        ]
        budgets = [check_prompt(ids, body.max_tokens) for ids in prompts]
        results = await asyncio.gather(
            *[
                run(ids, body.sampling_params(budget, body.logprobs), body.n)
                for ids, budget in zip(prompts, budgets, strict=True)
            ]
        )
        choices, completion_tokens = [], 0
        for prompt_index, (ids, outputs) in enumerate(zip(prompts, results, strict=True)):
            for output in outputs:
                index = prompt_index * body.n + output.index
                choices.append(protocol.completion_choice(index, output, ids, body, tokenizer))
                completion_tokens += len(output.token_ids)
        response = protocol.envelope("text_completion", body.model or served.model_names()[-1])
        response["choices"] = choices
        response["usage"] = protocol.usage(sum(len(p) for p in prompts), completion_tokens)
        return JSONResponse(response)

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(body: protocol.ChatCompletionRequest) -> JSONResponse:
        resolve_model(body.model)
        prompt_ids = _apply_chat_template(tokenizer, body)
        max_tokens = (
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else (body.max_tokens)
        )
        budget = check_prompt(prompt_ids, max_tokens)
        top = (body.top_logprobs or 0) if body.logprobs else None
        outputs = await run(prompt_ids, body.sampling_params(budget, top), body.n)
        response = protocol.envelope("chat.completion", body.model or served.model_names()[-1])
        response["choices"] = [protocol.chat_choice(o, body, tokenizer) for o in outputs]
        response["usage"] = protocol.usage(len(prompt_ids), sum(len(o.token_ids) for o in outputs))
        if body.return_token_ids:
            response["prompt_token_ids"] = prompt_ids
        return JSONResponse(response)

    @app.post("/tokenize", dependencies=guarded)
    async def tokenize(body: protocol.TokenizeRequest) -> dict[str, Any]:
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of `prompt` or `messages`")
        if body.messages is not None:
            ids = _encode_messages(tokenizer, body.messages, body.add_generation_prompt)
        else:
            ids = tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"]
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}

    async def weights_call(function: Any, *args: Any) -> dict[str, Any]:
        try:
            info: WeightInfo = await asyncio.to_thread(function, *args)
        except WeightLoadError as error:
            raise APIError(400, str(error)) from error
        return _info(info)

    @app.post("/update_weights", dependencies=guarded)
    async def update_weights(body: protocol.UpdateWeightsRequest) -> dict[str, Any]:
        return await weights_call(served.update_weights, body.weight_dir, body.version)

    @app.post("/v1/load_lora_adapter", dependencies=guarded)
    async def load_lora(
        body: protocol.LoadLoraRequest, version: int | None = None
    ) -> dict[str, Any]:
        return await weights_call(
            served.load_lora, body.lora_name, body.lora_path, body.load_inplace, version
        )

    @app.post("/v1/unload_lora_adapter", dependencies=guarded)
    async def unload_lora(body: protocol.UnloadLoraRequest) -> dict[str, Any]:
        return await weights_call(served.unload_lora, body.lora_name)

    @app.get("/weight_info", dependencies=guarded)
    async def weight_info() -> dict[str, Any]:
        return _info(served.info())

    @app.post("/pause", dependencies=guarded)
    async def pause(mode: PauseMode = "abort") -> dict[str, Any]:
        await asyncio.to_thread(engine.pause, mode)
        return {"is_paused": True, "mode": mode}

    @app.post("/resume", dependencies=guarded)
    async def resume() -> dict[str, Any]:
        engine.resume()
        return {"is_paused": False}

    @app.get("/is_paused", dependencies=guarded)
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": engine.is_paused}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(engine, served.name))

    return app


def _info(info: WeightInfo) -> dict[str, Any]:
    return {
        "version": info.version,
        "fingerprint": info.fingerprint,
        "weight_dir": info.weight_dir,
        "lora_name": info.lora_name,
    }


def _encode_messages(tokenizer: Any, messages: list[Any], add_generation_prompt: bool) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [m.model_dump() for m in messages],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def _apply_chat_template(tokenizer: Any, body: protocol.ChatCompletionRequest) -> list[int]:
    if tokenizer.chat_template is None:
        raise APIError(400, "the model's tokenizer has no chat template; use /v1/completions")
    try:
        rendered = tokenizer.apply_chat_template(
            [m.model_dump() for m in body.messages],
            tokenize=False,
            add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
            continue_final_message=body.continue_final_message,
            **(body.chat_template_kwargs or {}),
        )
    except Exception as error:  # template errors are the request's fault (bad roles, etc.)
        raise APIError(400, f"chat template failed: {error}") from error
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def serve(config: InferenceConfig) -> None:
    """Load the model, start the engine and serve until interrupted."""
    import uvicorn

    served = load_served_model(config)
    receiver = None
    if config.weight_broadcast_type == "nccl":
        receiver = WeightReceiverThread(served, config)
        receiver.start()
    app = build_app(config, served, receiver)
    logger.info(
        "serving %s on http://%s:%d (max_num_seqs %d, max_model_len %d)",
        served.name,
        config.host,
        config.port,
        config.max_num_seqs,
        served.engine.max_model_len,
    )
    try:
        uvicorn.run(app, host=config.host, port=config.port, log_level="warning")
    finally:
        if receiver is not None:
            receiver.stop()
        served.engine.shutdown()
