"""Request and response shapes of the OpenAI API as vLLM serves it, so one client fits both.

Unknown request fields are ignored (as vLLM does) but sampling features we do not implement are
refused when set (penalties other than repetition, beam search, streaming), never ignored.
Values that would break the shared engine step are refused here with a 400: non-finite numbers,
temperatures between 0 and `MIN_TEMPERATURE`, extreme repetition penalties, seeds beyond 64
bits, strings that are not valid Unicode (lone surrogates), booleans given as token ids.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from asyncrl.inference.sampling import SamplingParams
from asyncrl.inference.sequences import CompletionOutput

MIN_TEMPERATURE = 1e-2  # below it (but above 0) logits / T overflow; vLLM clamps here too
TokenId = Annotated[StrictInt, Field(ge=0)]


def _valid_unicode(value: Any, where: str = "body") -> None:
    """Refuse lone surrogates (valid JSON escapes, not encodable text) anywhere in the body."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"{where}: not valid Unicode ({error.reason})") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _valid_unicode(key, where)
            _valid_unicode(item, f"{where}.{key}")
    elif isinstance(value, list):
        for item in value:
            _valid_unicode(item, where)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        _valid_unicode(data)
        return data


class _Request(_Body):
    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    min_tokens: int = Field(0, ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    repetition_penalty: float | None = Field(None, ge=1e-2, le=1e2)
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    stop_token_ids: list[TokenId] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    ignore_eos: bool = False
    stream: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False

    @model_validator(mode="after")
    def _refuse_unimplemented(self) -> _Request:
        if self.temperature is not None and 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"`temperature` must be 0 (greedy) or at least {MIN_TEMPERATURE}, "
                f"not {self.temperature}"
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"`min_tokens` ({self.min_tokens}) must not exceed `max_tokens` ({self.max_tokens})"
            )
        if self.stream:
            raise ValueError("`stream: true` is not supported by the embedded engine")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ValueError(f"`{name}` is not supported; use `repetition_penalty`")
        return self

    def sampling_params(self, max_tokens: int, top_logprobs: int | None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k in (None, 0) else self.top_k,
            repetition_penalty=self.repetition_penalty or 1.0,
            stop=[s for s in stop if s],
            include_stop_str_in_output=self.include_stop_str_in_output,
            stop_token_ids=list(self.stop_token_ids or []),
            seed=self.seed,
            logprobs=top_logprobs,
            ignore_eos=self.ignore_eos,
        )


TokenIds = list[TokenId]


class CompletionRequest(_Request):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    @model_validator(mode="after")
    def _no_echo(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("`echo` is not supported")
        if self.prompt == []:
            raise ValueError("`prompt` is empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(item, int) for item in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    role: str
    content: str | None = ""


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None

    @model_validator(mode="after")
    def _no_tools(self) -> ChatCompletionRequest:
        if self.tools:
            raise ValueError("`tools` are not supported by the embedded engine")
        return self


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class UpdateWeightsRequest(_Body):
    weight_dir: str
    version: int | None = Field(None, ge=0, description="Policy version (trainer step) of them.")


class LoadLoraRequest(_Body):
    lora_name: str = Field(min_length=1)
    lora_path: str
    load_inplace: bool = False


class UnloadLoraRequest(_Body):
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None


# responses ----------------------------------------------------------------------------------------
LOWEST_LOGPROB = -9999.0  # what -inf (a token top-k/top-p removed) is reported as, as in vLLM


def _token_text(token_id: int, tokenizer: Any, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else tokenizer.decode([token_id])


def _reported(logprob: float) -> float:
    """JSON has no -inf: a removed token's logprob is reported as LOWEST_LOGPROB."""
    return max(logprob, LOWEST_LOGPROB)


def _top_entries(step: list[tuple[int, float]], tokenizer: Any, as_ids: bool) -> dict[str, float]:
    """Top logprobs keyed by token text; two ids with the same text (special tokens decode to
    "") would overwrite each other, so the later one is keyed `token_id:N` instead."""
    entries: dict[str, float] = {}
    for token_id, value in step:
        text = _token_text(token_id, tokenizer, as_ids)
        entries[text if text not in entries else f"token_id:{token_id}"] = _reported(value)
    return entries


def completion_choice(
    index: int,
    output: CompletionOutput,
    prompt_ids: list[int],
    request: CompletionRequest,
    tokenizer: Any,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "text": output.text,
        "logprobs": None,
        "finish_reason": output.finish_reason,
        "stop_reason": output.stop_reason,
    }
    if request.logprobs is not None:
        as_ids = request.return_tokens_as_token_ids
        tokens = [_token_text(t, tokenizer, as_ids) for t in output.token_ids]
        offsets, position = [], 0
        for token in tokens:
            offsets.append(position)
            position += len(token)
        choice["logprobs"] = {
            "text_offset": offsets,
            "token_logprobs": [_reported(value) for value in output.logprobs],
            "tokens": tokens,
            "top_logprobs": [_top_entries(step, tokenizer, as_ids) for step in output.top_logprobs]
            if request.logprobs
            else None,
        }
    if request.return_token_ids:
        choice["token_ids"] = output.token_ids
        choice["prompt_token_ids"] = prompt_ids
        choice["policy_versions"] = output.policy_versions  # asyncrl extension, not in vLLM
    return choice


def chat_choice(
    output: CompletionOutput, request: ChatCompletionRequest, tokenizer: Any
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": output.index,
        "message": {"role": "assistant", "content": output.text},
        "logprobs": None,
        "finish_reason": output.finish_reason,
        "stop_reason": output.stop_reason,
    }
    if request.logprobs:
        as_ids = request.return_tokens_as_token_ids

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            text = _token_text(token_id, tokenizer, as_ids)
            return {"token": text, "logprob": _reported(logprob), "bytes": list(text.encode())}

        content = []
        for position, (token_id, logprob) in enumerate(
            zip(output.token_ids, output.logprobs, strict=True)
        ):
            item = entry(token_id, logprob)
            tops = output.top_logprobs[position] if output.top_logprobs else []
            item["top_logprobs"] = [entry(t, value) for t, value in tops]
            content.append(item)
        choice["logprobs"] = {"content": content}
    if request.return_token_ids:
        choice["token_ids"] = output.token_ids
        choice["policy_versions"] = output.policy_versions  # asyncrl extension, not in vLLM
    return choice


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def envelope(kind: Literal["text_completion", "chat.completion"], model: str) -> dict[str, Any]:
    prefix = "cmpl" if kind == "text_completion" else "chatcmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }
