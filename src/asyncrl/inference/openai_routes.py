"""The OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions, /tokenize.

Each request is checked against the model (name, vocabulary, context length) and answered with
a 4xx that says why when it cannot be served; the engine generates, `protocol` shapes answers.

The event loop only routes: templating and tokenisation run on a worker thread
(`PromptEncoder`), generation on the engine thread. A full queue answers 503, which clients
retry; a client that disconnects has its sequences aborted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from asyncrl.config.inference import InferenceConfig
from asyncrl.inference import protocol
from asyncrl.inference.api_errors import APIError
from asyncrl.inference.prompt_encoder import PromptEncoder
from asyncrl.inference.sampling import SamplingParams
from asyncrl.inference.sequences import CompletionOutput
from asyncrl.inference.served_model import ServedModel

DISCONNECT_POLL = 0.5  # seconds between checks that the client is still there


def openai_router(config: InferenceConfig, served: ServedModel) -> APIRouter:
    engine = served.engine
    tokenizer = engine.tokenizer
    vocab_size = int(engine.model.config.vocab_size)
    router = APIRouter()
    encoder = PromptEncoder(tokenizer, engine.max_model_len, config.trust_request_chat_template)

    async def generate(
        http: Request, work: list[tuple[list[int], SamplingParams]], n: int
    ) -> list[list[CompletionOutput]]:
        """Run every prompt; 503 when the queue is full, abort all if the client goes away."""
        wanted = len(work) * n
        if wanted > config.max_queued_seqs:
            raise APIError(
                400, f"the request asks for {wanted} sequences; at most {config.max_queued_seqs}"
            )
        _, waiting = engine.load()
        if waiting + wanted > config.max_queued_seqs:
            raise APIError(
                503, f"{waiting} sequences are queued; retry later", "ServiceUnavailable"
            )
        jobs = [engine.submit(ids, params, n) for ids, params in work]
        watcher = asyncio.create_task(abort_when_gone(http, jobs))
        try:
            return list(await asyncio.gather(*(asyncio.wrap_future(job.done) for job in jobs)))
        except asyncio.CancelledError:
            for job in jobs:
                engine.abort(job)
            raise
        finally:
            watcher.cancel()

    async def abort_when_gone(http: Request, jobs: list[Any]) -> None:
        while not await http.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL)
        for job in jobs:
            engine.abort(job)

    def check_stop_ids(body: protocol.CompletionRequest | protocol.ChatCompletionRequest) -> None:
        beyond = [t for t in body.stop_token_ids or [] if t >= vocab_size]
        if beyond:
            raise APIError(400, f"stop_token_ids {beyond[:3]} >= vocabulary size {vocab_size}")

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

    @router.get("/v1/models")
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

    @router.post("/v1/completions")
    async def completions(http: Request, body: protocol.CompletionRequest) -> JSONResponse:
        resolve_model(body.model)
        check_stop_ids(body)
        texts = body.prompts()
        if len(texts) > config.max_prompts_per_request:
            raise APIError(
                400,
                f"{len(texts)} prompts in one request; at most {config.max_prompts_per_request}",
            )
        encoder.check_length(sum(len(p) for p in texts if isinstance(p, str)))
        prompt_ids = [p if isinstance(p, list) else await encoder.encode(p) for p in texts]
        budgets = [check_prompt(ids, body.max_tokens) for ids in prompt_ids]
        work = [
            (ids, body.sampling_params(budget, body.logprobs))
            for ids, budget in zip(prompt_ids, budgets, strict=True)
        ]
        results = await generate(http, work, body.n)
        choices, completion_tokens = [], 0
        for prompt_index, (ids, outputs) in enumerate(zip(prompt_ids, results, strict=True)):
            for output in outputs:
                index = prompt_index * body.n + output.index
                choices.append(protocol.completion_choice(index, output, ids, body, tokenizer))
                completion_tokens += len(output.token_ids)
        response = protocol.envelope("text_completion", body.model or served.model_names()[-1])
        response["choices"] = choices
        response["usage"] = protocol.usage(sum(len(p) for p in prompt_ids), completion_tokens)
        return JSONResponse(response)

    @router.post("/v1/chat/completions")
    async def chat_completions(http: Request, body: protocol.ChatCompletionRequest) -> JSONResponse:
        resolve_model(body.model)
        check_stop_ids(body)
        prompt_ids = await encoder.render(
            body.messages,
            body.add_generation_prompt and not body.continue_final_message,
            **encoder.template_options(body),
        )
        max_tokens = (
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else (body.max_tokens)
        )
        budget = check_prompt(prompt_ids, max_tokens)
        top = (body.top_logprobs or 0) if body.logprobs else None
        [outputs] = await generate(http, [(prompt_ids, body.sampling_params(budget, top))], body.n)
        response = protocol.envelope("chat.completion", body.model or served.model_names()[-1])
        response["choices"] = [protocol.chat_choice(o, body, tokenizer) for o in outputs]
        response["usage"] = protocol.usage(len(prompt_ids), sum(len(o.token_ids) for o in outputs))
        if body.return_token_ids:
            response["prompt_token_ids"] = prompt_ids
        return JSONResponse(response)

    @router.post("/tokenize")
    async def tokenize(body: protocol.TokenizeRequest) -> dict[str, Any]:
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of `prompt` or `messages`")
        if body.messages is not None:
            ids = await encoder.render(body.messages, body.add_generation_prompt)
        else:
            assert body.prompt is not None
            ids = await encoder.encode(body.prompt, body.add_special_tokens)
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}

    return router
