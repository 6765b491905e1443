"""How the orchestrator drives each inference engine, chosen once per server from what the
server answers (`identify`), never by `if backend ==` at call sites.

- identified by: GET /version says `engine: asyncrl` (embedded), or gives only a version
  (vLLM); SGLang answers GET /get_model_info instead.
- generation: the OpenAI routes (embedded, vLLM); SGLang's /generate, translated both ways.
- full weights: POST /update_weights (embedded); /collective_rpc `asyncrl_reload_weights`
  (asyncrl's worker extension: vLLM's `reload_weights`, then a tied LM head repacked) then
  /reset_prefix_cache (vLLM); /update_weights_from_disk then /flush_cache (SGLang).
- LoRA: /v1/load_lora_adapter in place (embedded, vLLM); unload then load (SGLang).
- pause / resume: /pause?mode= and /resume (embedded, vLLM); /pause_generation and
  /continue_generation (SGLang).
- version: /weight_info, and per token (embedded); /weight_info as set by this file (vLLM);
  tracked by the client (SGLang).

vLLM's /weight_info reports a free-form `weight_version` that this client sets after every
load (`step`, or `step@fingerprint` when asyncrl's extension checked the weights against the
trainer's manifest), so a restarted orchestrator still learns what a running vLLM server holds.

Generation is translation only (`generate_call`, `generate_answer`): the request itself, with
its failover and abort-retry, is `generation.py`'s. Every other call here goes through
`generation.request`, the one HTTP call, which marks a server that never answers down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from asyncrl.orchestrator.generation import RETRIES, Server, request
from asyncrl.types import PauseMode

ChatTemplate = Callable[[list[dict[str, Any]]], list[int]]  # messages -> prompt token ids


def chat_template(tokenizer: Any) -> ChatTemplate:
    """Messages -> prompt token ids with the generation header, as the servers render them
    (`tokenizer`: a transformers tokenizer with a chat template)."""

    def render(messages: list[dict[str, Any]]) -> list[int]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    return render


class UnknownEngine(RuntimeError):
    """The server answered none of the ways the engines identify themselves."""


@dataclass
class EngineAPI:
    """vLLM's routes, the reference: asyncrl's own server imitates them, so the embedded and
    SGLang APIs below override only what differs."""

    http: httpx.AsyncClient  # the pool's client: its API key, timeouts and connections
    server: Server  # marked down by `request` when it never answers
    chat_prompt_ids: ChatTemplate | None = None  # for engines that take token ids only

    name: ClassVar[str] = "vllm"
    per_token_versions: ClassVar[bool] = False  # does each token carry the weights' version
    # the worker method that reloads full weights: asyncrl's extension's unless the server was
    # started without it and the model has no tied head (`startup_checks.check_engine_limits`)
    reload_method: str = "asyncrl_reload_weights"
    reloads: int = 0  # loads the extension read twice (cumulative, as servers report theirs)

    @property
    def root(self) -> str:  # http://host:port
        return self.server.root

    @property
    def base_url(self) -> str:  # http://host:port/v1
        return self.server.base_url

    def generate_call(self, route: str, body: dict[str, Any]) -> tuple[str, Any]:
        """The URL and JSON to POST for an OpenAI chat or text completion `body` (`n` choices)
        on `route`: here, the OpenAI route itself."""
        return f"{self.base_url}/{route}", body

    def generate_answer(self, route: str, sent: Any, answer: Any) -> dict[str, Any]:
        """The engine's `answer` to `sent` as an OpenAI response: here, already one."""
        response: dict[str, Any] = answer
        return response

    async def version(self) -> int | None:
        """The weights version the server holds, or None when it cannot tell. vLLM's
        free-form `weight_version` is set by this client (`_set_version`): `step`, with
        `@fingerprint` when the extension checked the weights, which goes to
        `server.reported`."""
        info = await self._call("GET", f"{self.root}/weight_info", retries=1)
        step, _, fingerprint = str(info.get("weight_version", "")).partition("@")
        self.server.reported = fingerprint or None
        return int(step) if step.isdigit() else 0

    async def version_change(self, known: int, timeout: float) -> None:
        """Return once the server holds another version than `known`, or after `timeout`:
        here, only the timeout (vLLM's /weight_info cannot be waited on)."""
        await asyncio.sleep(timeout)

    async def load_full(self, weight_dir: str, step: int) -> dict[str, Any] | None:
        """Load full weights; returns what the server says it loaded (`version`, `verified`:
        the trainer's fingerprint it checked them against, `weight_reloads`, ...), or None when
        it cannot say (vLLM without asyncrl's extension). vLLM: every worker's answer, which
        must agree."""
        body = {"method": self.reload_method, "kwargs": {"weights_path": weight_dir}}
        answer = await self._call("POST", f"{self.root}/collective_rpc", body)
        await self._call("POST", f"{self.root}/reset_prefix_cache")  # cached KV is stale
        results = answer.get("results") if isinstance(answer, dict) else None
        if not results or not all(isinstance(r, dict) and "verified" in r for r in results):
            await self._set_version(step)
            return None
        verified = {result["verified"] for result in results}
        info = dict(
            results[0], version=step, verified=verified.pop() if len(verified) == 1 else None
        )
        self.reloads += sum(int(r.get("weight_reloads") or 0) for r in results)
        info["weight_reloads"] = self.reloads
        await self._set_version(step, info["verified"])
        self.server.reported = info["verified"]
        return info

    async def load_lora(self, name: str, path: str, step: int) -> dict[str, Any] | None:
        body = {"lora_name": name, "lora_path": path, "load_inplace": True}
        await self._call("POST", f"{self.base_url}/load_lora_adapter", body)
        await self._call("POST", f"{self.root}/reset_prefix_cache")
        await self._set_version(step)
        return None

    async def pause(self, mode: PauseMode) -> None:
        await self._call("POST", f"{self.root}/pause?mode={mode}")

    async def resume(self) -> None:
        await self._call("POST", f"{self.root}/resume")

    async def _call(self, method: str, url: str, json: Any = None, retries: int = RETRIES) -> Any:
        """`request` on this server, with the pool's client."""
        return await request(self.http, self.server, method, url, json, retries)

    async def _set_version(self, step: int, fingerprint: str | None = None) -> None:
        version = f"{step}@{fingerprint}" if fingerprint else str(step)
        await self._call("POST", f"{self.root}/update_weight_version", {"new_version": version})


@dataclass
class EmbeddedAPI(EngineAPI):
    """asyncrl's own server: loads are versioned by the server, every token reports its version."""

    name: ClassVar[str] = "embedded"
    per_token_versions: ClassVar[bool] = True

    async def version(self) -> int | None:
        info = await self._call("GET", f"{self.root}/weight_info", retries=1)
        self.server.reported = info.get("fingerprint") if not info.get("lora_name") else None
        return int(info["version"])

    async def version_change(self, known: int, timeout: float) -> None:
        """A long-polled /weight_info: answered the moment weights are installed."""
        url = f"{self.root}/weight_info?changed_from={known}&wait={timeout:.3f}"
        await self._call("GET", url, retries=1)

    async def load_full(self, weight_dir: str, step: int) -> dict[str, Any] | None:
        body = {"weight_dir": weight_dir, "version": step}
        info: dict[str, Any] = await self._call("POST", f"{self.root}/update_weights", body)
        self.server.reported = info.get("fingerprint")
        return info

    async def load_lora(self, name: str, path: str, step: int) -> dict[str, Any] | None:
        body = {"lora_name": name, "lora_path": path, "load_inplace": True}
        url = f"{self.base_url}/load_lora_adapter?version={step}"
        info: dict[str, Any] = await self._call("POST", url, body)
        self.server.reported = None  # merged with the adapter: not the marker's fingerprint
        return info


SGLANG_PAUSE_MODES = {"abort": "abort", "keep": "in_place"}


@dataclass
class SGLangAPI(EngineAPI):
    """SGLang's native routes (as TRL's SGLang backend uses them). Untested against a real
    SGLang server: there is no CPU build; the tests use a stand-in that speaks these routes."""

    name: ClassVar[str] = "sglang"

    def generate_call(self, route: str, body: dict[str, Any]) -> tuple[str, Any]:
        """SGLang's /generate with the prompt as ids (a chat rendered by its template), the
        prompt repeated for each of the `n` samples."""
        if "messages" in body:
            if self.chat_prompt_ids is None:
                raise ValueError("SGLang chat requests need the model's chat template")
            prompt = self.chat_prompt_ids(body["messages"])
        else:
            prompt = list(body["prompt"])
        n = int(body.get("n", 1))
        sampling = {
            "temperature": body.get("temperature", 1.0),
            "top_p": body.get("top_p", 1.0),
            "top_k": body.get("top_k", -1),
            "min_new_tokens": body.get("min_tokens", 0),
            "repetition_penalty": body.get("repetition_penalty", 1.0),
            "max_new_tokens": body.get("max_tokens"),
            "stop": body.get("stop"),
            "no_stop_trim": bool(body.get("include_stop_str_in_output")),
        }
        native = {
            "input_ids": [prompt] * n,
            "sampling_params": {k: v for k, v in sampling.items() if v is not None},
            "return_logprob": True,
        }
        return f"{self.root}/generate", native

    def generate_answer(self, route: str, sent: Any, answer: Any) -> dict[str, Any]:
        """/generate's outputs (one per sample, or one alone) for the prompt `sent` asked."""
        prompt = list(sent["input_ids"][0])
        return openai_response(route, prompt, answer if isinstance(answer, list) else [answer])

    async def version(self) -> int | None:
        return None

    async def load_full(self, weight_dir: str, step: int) -> dict[str, Any] | None:
        result = await self._call(
            "POST", f"{self.root}/update_weights_from_disk", {"model_path": weight_dir}
        )
        if not result.get("success", False):
            raise RuntimeError(f"SGLang refused weights {weight_dir}: {result.get('message')}")
        await self._call("POST", f"{self.root}/flush_cache")
        return None

    async def load_lora(self, name: str, path: str, step: int) -> dict[str, Any] | None:
        # SGLang has no in-place reload: replace the adapter under the same name
        with contextlib.suppress(RuntimeError):  # nothing loaded under that name yet
            body = {"lora_name": name}
            await self._call("POST", f"{self.root}/unload_lora_adapter", body, retries=1)
        await self._call(
            "POST", f"{self.root}/load_lora_adapter", {"lora_name": name, "lora_path": path}
        )
        await self._call("POST", f"{self.root}/flush_cache")
        return None

    async def pause(self, mode: PauseMode) -> None:
        if mode not in SGLANG_PAUSE_MODES:
            raise ValueError(f"SGLang cannot pause with mode `{mode}`; use abort or keep")
        body = {"mode": SGLANG_PAUSE_MODES[mode]}
        await self._call("POST", f"{self.root}/pause_generation", body)

    async def resume(self) -> None:
        await self._call("POST", f"{self.root}/continue_generation")


def openai_response(route: str, prompt: list[int], outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """SGLang /generate outputs (one per sample) in the OpenAI shape the orchestrator parses."""
    choices = []
    for index, output in enumerate(outputs):
        meta = output["meta_info"]
        token_ids = [int(entry[1]) for entry in meta["output_token_logprobs"]]
        logprobs = [float(entry[0]) for entry in meta["output_token_logprobs"]]
        finish = meta.get("finish_reason") or {}
        reason = "length" if finish.get("type") == "length" else "stop"
        choice: dict[str, Any] = {"index": index, "token_ids": token_ids, "finish_reason": reason}
        if route == "chat/completions":
            choice["message"] = {"role": "assistant", "content": output["text"]}
            choice["logprobs"] = {"content": [{"logprob": value} for value in logprobs]}
        else:
            choice["text"] = output["text"]
            choice["logprobs"] = {"token_logprobs": logprobs}
            choice["prompt_token_ids"] = prompt
        choices.append(choice)
    return {"choices": choices, "prompt_token_ids": prompt}


ENGINES: dict[str, type[EngineAPI]] = {
    "embedded": EmbeddedAPI,
    "vllm": EngineAPI,
    "sglang": SGLangAPI,
}


async def identify(http: httpx.AsyncClient, server: Server) -> str:
    """Which engine serves at `server`, from the routes it answers."""
    root = server.root
    try:
        info = await request(http, server, "GET", f"{root}/version", retries=1)
        return "embedded" if info.get("engine") == "asyncrl" else "vllm"
    except RuntimeError:
        pass
    try:
        await request(http, server, "GET", f"{root}/get_model_info", retries=1)
        return "sglang"
    except RuntimeError as error:
        raise UnknownEngine(
            f"{root} answers neither /version (asyncrl, vLLM) nor /get_model_info (SGLang): "
            "cannot tell how to update its weights"
        ) from error
