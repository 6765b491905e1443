"""Prompt text to token ids, off the event loop and bounded: the request path's tokenizer.

Tokenising a few megabytes, or rendering a template, takes seconds of CPU; on the event loop
that would stall every other client (and /health). Here it runs on one worker thread, after a
length check, and chat templates come from the model, never the request, unless the server
trusts request templates (a template is code the server runs, with no bound on its time).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from asyncrl.inference import protocol
from asyncrl.inference.api_errors import APIError

T = TypeVar("T")
MAX_CHARS_PER_TOKEN = 32  # text longer than this per token of context is refused untokenized


class PromptEncoder:
    def __init__(self, tokenizer: Any, max_model_len: int, trust_request_template: bool) -> None:
        self.tokenizer = tokenizer
        self.max_chars = MAX_CHARS_PER_TOKEN * max_model_len
        self.max_model_len = max_model_len
        self.trust_request_template = trust_request_template
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="asyncrl-tokenize")
        self._template_parameters = set(inspect.signature(tokenizer.apply_chat_template).parameters)

    def check_length(self, characters: int) -> None:
        if characters > self.max_chars:
            raise APIError(
                400,
                f"the prompt has {characters} characters; at most {self.max_chars} are read "
                f"({MAX_CHARS_PER_TOKEN} per token of max_model_len {self.max_model_len})",
            )

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.check_length(len(text))
        return await self._off_loop(
            lambda: self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        )

    async def render(
        self, messages: list[protocol.ChatMessage], add_generation_prompt: bool, **options: Any
    ) -> list[int]:
        """Messages through the chat template, then tokenized; template errors are the
        request's fault (bad roles, missing content), so they are 400s."""
        if self.tokenizer.chat_template is None and "chat_template" not in options:
            raise APIError(400, "the model's tokenizer has no chat template; use /v1/completions")
        self.check_length(sum(len(str(message.content or "")) for message in messages))
        dumped = [message.model_dump() for message in messages]

        def apply() -> list[int]:
            rendered = self.tokenizer.apply_chat_template(
                dumped, tokenize=False, add_generation_prompt=add_generation_prompt, **options
            )
            self.check_length(len(rendered))
            return self.tokenizer(rendered, add_special_tokens=False)["input_ids"]

        try:
            return await self._off_loop(apply)
        except APIError:
            raise
        except Exception as error:
            raise APIError(400, f"chat template failed: {error}") from error

    def template_options(self, body: protocol.ChatCompletionRequest) -> dict[str, Any]:
        """`chat_template_kwargs` as template variables only: none of the call's own arguments,
        and no template of the request's own unless trusted."""
        options = dict(body.chat_template_kwargs or {})
        if "chat_template" in options and not self.trust_request_template:
            raise APIError(
                400,
                "a request may not bring its own `chat_template` (the server would run it); "
                "start the server with trust_request_chat_template: true to allow it",
            )
        reserved = sorted((self._template_parameters & set(options)) - {"chat_template"})
        if reserved:
            raise APIError(400, f"`chat_template_kwargs` may not set {reserved}")
        options["continue_final_message"] = body.continue_final_message
        return options

    async def _off_loop(self, function: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, function)
