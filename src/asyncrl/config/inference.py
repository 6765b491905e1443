"""Configuration of the inference role (`asyncrl infer`): keys follow the seeds' inference table."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from asyncrl.config.base import StrictModel, wired
from asyncrl.config.transport import WeightTransportName

Dtype = Literal["auto", "float32", "float16", "bfloat16"]


class InferenceConfig(StrictModel):
    """An OpenAI-compatible server that returns token ids and logprobs and reloads weights."""

    model: str = wired(..., description="Hugging Face model id or local path.", source="model")
    backend: Literal["embedded", "vllm", "sglang"] = Field(
        "embedded",
        description="Engine behind the server: `embedded` (PyTorch + transformers, this "
        "process), `vllm` or `sglang` (their own server, launched as a child process).",
    )
    executable: str | None = Field(
        None,
        description="(vllm, sglang) Python interpreter that has the engine installed, usually "
        "a venv of its own (vLLM pins its own torch and transformers); null = this one. With "
        "`deployment: colocated` the trainer itself runs under it (`make vllm` installs "
        "asyncrl there too).",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="(vllm, sglang) Further command-line flags passed to the engine as written.",
    )
    startup_timeout: float = Field(
        600, gt=0, description="(vllm, sglang) Seconds the engine may take to become healthy."
    )
    host: str = Field(
        "127.0.0.1",
        description="Bind address. Loopback unless set: use 0.0.0.0 to serve other machines.",
    )
    port: int = Field(8000, ge=1, le=65535, description="Bind port.")
    api_key_var: str = Field(
        "VLLM_API_KEY",
        description="Environment variable holding the bearer API key the server requires on "
        "every route but /health, /version and /metrics (vLLM's development routes too). Unset "
        "or empty: no key, allowed on a loopback `host` only (the server refuses to start "
        "without one on any other address).",
    )
    served_model_name: str | None = Field(
        None, description="Name clients use in `model` (null = the `model` value)."
    )
    dtype: Dtype = Field("auto", description="Weights and activations dtype.")
    quantization: Literal["none", "int8"] = Field(
        "none",
        description="(embedded, CPU) `int8`: the engine's linear layers, LM head included, "
        "multiply int8 copies of their weights (one scale per output channel) by each row of "
        "activations quantized to int8 with a scale of its own, summed exactly in int32 "
        "(torch's `_int_mm`); norms, embeddings, attention, the KV cache and sampling stay in "
        "`dtype`. Rollouts then come from the int8 model with its logprobs, while the trainer "
        "keeps its own precision: its importance-sampling correction handles the difference "
        "(`trainer/mismatch_kl`). Loaded weights and LoRA merges are quantized again from their "
        "float values. `none`: the weights as loaded. Not with `deployment: colocated`; vLLM "
        "and SGLang take their own `--quantization` in `extra_args`.",
    )
    max_num_seqs: int = Field(
        256, ge=1, description="Sequences generated together (KV cache slots)."
    )
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="Prompt tokens prefilled in one batched pass."
    )
    weight_roots: list[str] = Field(
        default_factory=lambda: ["outputs"],
        description="Directories under which weight and adapter updates may be read; "
        "anything else is refused.",
    )
    max_request_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 above)."
    )
    max_prompts_per_request: int = Field(
        1024, ge=1, description="Prompts one completions request may carry (400 above)."
    )
    max_queued_seqs: int = Field(
        4096,
        ge=1,
        description="Sequences waiting for a slot before new requests get 503 (clients retry).",
    )
    max_connections: int = Field(
        1024, ge=1, description="Open connections served at once (503 above, by uvicorn)."
    )
    request_read_timeout: float = Field(
        30, gt=0, description="Seconds a client may take to send its request body (408 after)."
    )
    shutdown_timeout: float = Field(
        5, gt=0, description="Seconds in-flight requests get to finish on SIGTERM."
    )
    trust_request_chat_template: bool = Field(
        False,
        description="Let requests pass their own `chat_template` (in `chat_template_kwargs`). "
        "Off: a template is code the server runs, and can take unbounded time and memory.",
    )
    max_model_len: int | None = Field(
        None, gt=0, description="Maximum context length (prompt + completion); null = model's."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs (vLLM).")
    trust_remote_code: bool = Field(False, description="Allow custom model code from the hub.")
    tp: int = Field(1, ge=1, description="(vllm, sglang) Tensor parallelism degree.")
    dp: int = Field(1, ge=1, description="(vllm, sglang) Data parallelism degree.")
    enable_lora: bool = Field(True, description="Enable LoRA adapter hot-reload.")
    max_lora_rank: int | None = Field(
        None, gt=0, description="Maximum LoRA rank (rounded up to a rank vLLM accepts)."
    )
    max_loras: int = Field(8, ge=1, description="LoRA adapters loaded at once.")
    max_cpu_loras: int = Field(100, ge=1, description="LoRA adapters cached on CPU.")
    enable_prefix_caching: bool | None = Field(
        None,
        description="Keep finished sequences' keys and values for later requests that begin "
        "with the same tokens (a conversation's next turn). null = the engine's default: off "
        "in the embedded engine, on in vLLM.",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory for weights and KV cache."
    )
    weight_broadcast_type: WeightTransportName = wired(
        "filesystem",
        description="How weight updates arrive: `filesystem` (/update_weights, LoRA loads), "
        "`nccl` (received from the trainer over torch.distributed; gloo on CPU), or the "
        "trainer's own `package.module:TRANSPORT`.",
        source="weight_broadcast.type",
    )
    weight_broadcast_host: str = wired(
        "localhost", description="(nccl) Trainer's rendezvous host.", source="weight_broadcast.host"
    )
    weight_broadcast_port: int = wired(
        29501,
        ge=1,
        le=65535,
        description="(nccl) Trainer's rendezvous port.",
        source="weight_broadcast.port",
    )
    weight_broadcast_timeout: float = wired(
        1200,
        gt=0,
        description="(nccl) Seconds a transfer may take before it raises.",
        source="weight_broadcast.timeout",
    )
    weight_broadcast_rank: int = wired(
        1,
        ge=1,
        description="(nccl) This server's rank (the trainer is rank 0).",
        source="weight_broadcast.inference_world_size (the launcher numbers the servers)",
    )
    weight_broadcast_world_size: int = wired(
        2,
        ge=2,
        description="(nccl) Trainer plus every receiving inference server.",
        source="weight_broadcast.inference_world_size",
    )
    reasoning_parser: str | None = Field(
        None, description="Parser that splits reasoning content from the answer (vLLM)."
    )
    enable_auto_tool_choice: bool = Field(False, description="Enable auto tool choice (vLLM).")
    tool_call_parser: str | None = Field(
        None, description="(vllm) Tool-call parser used with `enable_auto_tool_choice`."
    )
    kv_cache_memory_bytes: int | None = Field(
        None,
        gt=0,
        description="KV cache size in bytes. vLLM: instead of `gpu_memory_utilization` (on CPU, "
        "134217728 keeps a tiny model's server near 2 GB). Embedded: the most its slots may take "
        "(null = a quarter of the machine's memory, or half the GPU's free memory); "
        "`max_num_seqs` is lowered, with a warning, to the slots of `max_model_len` that fit.",
    )
    rope_scaling: dict[str, Any] | None = Field(
        None, description="RoPE scaling configuration passed to the model config."
    )

    @model_validator(mode="after")
    def _fits_the_backend(self) -> InferenceConfig:
        if self.backend == "embedded" and (self.tp, self.dp) != (1, 1):
            raise ValueError(
                f"`tp`/`dp` ({self.tp}/{self.dp}) need `backend: vllm` or `sglang`: the embedded "
                "engine runs on one device"
            )
        if self.backend != "embedded" and self.quantization != "none":
            raise ValueError(
                f"`quantization: {self.quantization}` is the embedded engine's; with `backend: "
                f"{self.backend}` pass the engine's own `--quantization` in `extra_args`"
            )
        if self.backend != "embedded" and self.weight_broadcast_type != "filesystem":
            raise ValueError(
                f"`weight_broadcast_type: {self.weight_broadcast_type}` is built for the embedded "
                f"engine only; with `backend: {self.backend}` use `filesystem` (reload from disk)"
            )
        return self
