"""The OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions, /tokenize.

Each request is checked against the model (name, vocabulary, context length) and answered with
a 4xx that says why when it cannot be served; the engine generates, `protocol` shapes answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter
from fastapi.params import Depends
from fastapi.responses import JSONResponse

from asyncrl.config.inference import InferenceConfig
from asyncrl.inference import protocol
from asyncrl.inference.api_errors import APIError
from asyncrl.inference.served_model import ServedModel


def openai_router(
    config: InferenceConfig, served: ServedModel, guarded: Sequence[Depends]
) -> APIRouter:
    engine = served.engine
    tokenizer = engine.tokenizer
    vocab_size = int(engine.model.config.vocab_size)
    router = APIRouter(dependencies=list(guarded))

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

    async def run(prompt_ids: list[int], params: Any, n: int) -> list[Any]:
        request = engine.submit(prompt_ids, params, n)
        try:
            return await asyncio.wrap_future(request.done)
        except asyncio.CancelledError:  # client went away: free its slots
            engine.abort(request)
            raise

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

    @router.post("/v1/chat/completions")
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

    @router.post("/tokenize")
    async def tokenize(body: protocol.TokenizeRequest) -> dict[str, Any]:
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of `prompt` or `messages`")
        if body.messages is not None:
            ids = _encode_messages(tokenizer, body.messages, body.add_generation_prompt)
        else:
            ids = tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"]
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}

    return router


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
