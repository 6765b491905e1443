"""A STAND-IN for `python -m sglang.launch_server`, for tests only: SGLang has no CPU build here.

It speaks the SGLang routes asyncrl uses (/generate with token logprobs, /update_weights_from_disk,
/flush_cache, LoRA load/unload, pause/continue, /get_model_info) over a transformers model, and
records every admin call at /calls so tests can check the order. Like SGLang it takes an API key
from `--api-key` or from the YAML file `--config` names (`api-key:`), and then wants it as a
bearer token on every route but /health. It is not SGLang.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import uvicorn
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from transformers import AutoModelForCausalLM, AutoTokenizer


def build(model_path: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def wants_the_key(request: Request, call_next: Any) -> Any:
        given = request.headers.get("authorization")
        if api_key and request.url.path != "/health" and given != f"Bearer {api_key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    state: dict[str, Any] = {
        "model": AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval(),
        "calls": [],
    }
    tokenizer = AutoTokenizer.from_pretrained(model_path)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {}

    @app.get("/get_model_info")
    def model_info() -> dict[str, Any]:
        return {"model_path": model_path, "is_generation": True}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"data": [{"id": model_path}]}

    @app.get("/calls")
    def calls() -> list[Any]:
        return state["calls"]

    @app.post("/generate")
    def generate(body: dict[str, Any]) -> list[dict[str, Any]]:
        params = body["sampling_params"]
        return [sample(state["model"], tokenizer, ids, params) for ids in body["input_ids"]]

    @app.post("/update_weights_from_disk")
    def update(body: dict[str, Any]) -> dict[str, Any]:
        state["calls"].append(["update_weights_from_disk", body["model_path"]])
        state["model"] = AutoModelForCausalLM.from_pretrained(
            body["model_path"], dtype=torch.float32
        ).eval()
        return {"success": True, "message": "updated"}

    for route in ("flush_cache", "load_lora_adapter", "unload_lora_adapter",
                  "pause_generation", "continue_generation"):  # fmt: skip
        app.post(f"/{route}")(recorder(state, route))
    return app


def recorder(state: dict[str, Any], route: str) -> Any:
    async def record(body: dict[str, Any] | None = None) -> dict[str, Any]:
        state["calls"].append([route, body])
        return {"success": True}

    return record


@torch.no_grad()
def sample(model: Any, tokenizer: Any, prompt: list[int], params: dict[str, Any]) -> dict[str, Any]:
    """Plain sampling at `temperature`; logprobs of the distribution sampled from."""
    ids, entries = list(prompt), []
    for _ in range(int(params.get("max_new_tokens") or 16)):
        logits = model(torch.tensor([ids])).logits[0, -1] / float(params["temperature"])
        logprobs = torch.log_softmax(logits, dim=-1)
        token = int(torch.multinomial(logprobs.exp(), 1))
        entries.append([float(logprobs[token]), token, None])
        ids.append(token)
        if token == tokenizer.eos_token_id:
            break
    output = ids[len(prompt) :]
    finish = {"type": "stop"} if output[-1] == tokenizer.eos_token_id else {"type": "length"}
    return {
        "text": tokenizer.decode(output, skip_special_tokens=True),
        "output_ids": output,
        "meta_info": {"finish_reason": finish, "output_token_logprobs": entries},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key")
    parser.add_argument("--config")
    known, _ = parser.parse_known_args()  # every other SGLang flag is accepted and ignored
    key = known.api_key
    if known.config:
        with open(known.config) as config:
            key = yaml.safe_load(config).get("api-key", key)
    app = build(known.model_path, key)
    uvicorn.run(app, host=known.host, port=known.port, log_level="warning")
