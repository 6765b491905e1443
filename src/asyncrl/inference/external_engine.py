"""`asyncrl infer` with `backend: vllm | sglang`: the engine's own OpenAI server, as a child.

Every inference key is mapped to the engine's flag here, in one place, so a config written for
the embedded engine starts vLLM or SGLang with the same meaning. The engine runs from
`executable` (a venv of its own: vLLM pins its own torch and transformers), writes its log to
ours, and dies with us: stopped on SIGTERM or Ctrl-C, and killed by the kernel if we are
(PR_SET_PDEATHSIG).

The API key (`access.py`: the user's, else the run's secret's) never appears on the engine's
command line, where `ps` shows it to every user of the machine, nor in its environment, which
`/proc/<pid>/environ` shows to every process of its user: vLLM's process gets it over a socket
(`secret_handover.py`), read by asyncrl's guard, which then marks that process not dumpable;
SGLang, which takes it only as a flag, reads it from a config file (`--config`, SGLang 0.5.3
or later) written for it alone (mode 0600 in a private directory) and removed once the server
answers.

vLLM runs in development mode (`VLLM_SERVER_DEV_MODE=1`): the routes asyncrl drives it with
(/collective_rpc, /pause, /reset_prefix_cache) exist only there, beside others nobody outside
the run may call (/sleep; /collective_rpc runs any worker method). vLLM's own key guards its
`/v1` routes only, so with a key `asyncrl infer` hands vLLM asyncrl's guard as `--middleware`
(`web/api_key.EngineKeyGuard`): every route but /health, /version and /metrics needs the key.
Without a key the server must be on loopback (`access.py`); a `--host` or `--api-key` in
`extra_args`, which would bypass both, is refused. The worker extension reloads weights only
from under `weight_roots`, handed to it resolved in `$ASYNCRL_WEIGHT_ROOTS`. The engine starts
without the run's secret (it opens no channel of the run) and with no inference key but the
configured one.

vLLM is started with `--logprobs-mode processed_logprobs`: by default it returns logprobs before
temperature, and asyncrl's contract (and the trainer's importance ratios) is the logprob of the
distribution actually sampled from.

On a machine with no GPU, a one-rank vLLM runs its model worker inside its engine-core process,
as it does on one GPU. vLLM's CPU platform otherwise starts a third process for the worker, so
that it starts with the OpenMP environment the platform sets; the engine-core process is spawned
after that setting too, so it has the same environment. The third process imported vLLM again:
10 s of CPU and 8 s of start-up per server (AMD EPYC Zen 4, the tiny model), same logprobs.

Asked for eager (`enforce_eager`) on a machine with no GPU, vLLM runs with torch.compile off
(`TORCHDYNAMO_DISABLE=1`, unless the environment sets it already). vLLM compiles no model then,
but still compiles a sampler helper with inductor: the rank of each sampled token's logprob,
which every asyncrl request asks for. Cold, that runs a C++ compiler: 12 s of CPU per server
start, 1.7 s once inductor's cache in /tmp holds it (Zen 4, the tiny model). Eager, it is one
comparison and a sum, through a temporary [sequences × vocabulary] boolean: 39 MB for 256
sequences of Qwen's 151,680 tokens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

import yaml

from asyncrl.config.base import ConfigError
from asyncrl.config.inference import InferenceConfig
from asyncrl.gpu_presence import could_have_gpus
from asyncrl.inference.access import log_access, server_api_key
from asyncrl.inference.dtype import external_engine_dtype
from asyncrl.inference.weight_roots import resolved_roots
from asyncrl.log import get_logger
from asyncrl.processes import start, stop, wait_healthy
from asyncrl.run_secret import RUN_SECRET_ENV, server_key
from asyncrl.secret_handover import SECRETS_FD_ENV
from asyncrl.transport.vllm_worker_extension import EXTENSION, WEIGHT_ROOTS_ENV
from asyncrl.web.api_key import ENGINE_KEY_ENV

ENGINE_GUARD = "asyncrl.web.api_key.EngineKeyGuard"  # vLLM's `--middleware`, with a key
# flags that would bind elsewhere than `host` (a Unix socket too) or put a key on the command
# line: refused, and so is every abbreviation of one (the engines' parsers take a flag's prefix)
REFUSED_FLAGS = {"--host": "host", "--uds": "host", "--api-key": "api_key_var"}

logger = get_logger(__name__)

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts that holds `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"`max_lora_rank` {rank} is above vLLM's largest, {VLLM_LORA_RANKS[-1]}")


def vllm_worker_in_engine_core(config: InferenceConfig, gpus_possible: bool | None = None) -> bool:
    """Whether vLLM's one worker runs in its engine-core process (see the module's docstring):
    on a machine with no GPU, with one rank, unless `extra_args` names an executor itself."""
    if gpus_possible is None:
        gpus_possible = could_have_gpus()
    chosen = any(arg.startswith("--distributed-executor-backend") for arg in config.extra_args)
    return not gpus_possible and config.tp * config.dp == 1 and not chosen


def vllm_compiles_nothing(config: InferenceConfig, gpus_possible: bool | None = None) -> bool:
    """Whether vLLM runs with torch.compile off (see the module's docstring): eager asked for,
    no GPU on this machine, and `TORCHDYNAMO_DISABLE` not set by the user."""
    if gpus_possible is None:
        gpus_possible = could_have_gpus()
    return config.enforce_eager and not gpus_possible and "TORCHDYNAMO_DISABLE" not in os.environ


def vllm_command(config: InferenceConfig, gpus_possible: bool | None = None) -> list[str]:
    command = [
        config.executable or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", config.model,
        "--host", config.host,
        "--port", str(config.port),
        "--dtype", config.dtype,
        "--tensor-parallel-size", str(config.tp),
        "--data-parallel-size", str(config.dp),
        "--max-num-seqs", str(config.max_num_seqs),
        "--max-num-batched-tokens", str(config.max_num_batched_tokens),
        "--gpu-memory-utilization", str(config.gpu_memory_utilization),
        "--logprobs-mode", "processed_logprobs",
        "--worker-extension-cls", EXTENSION,
    ]  # fmt: skip
    if config.served_model_name:
        command += ["--served-model-name", config.served_model_name]
    if config.max_model_len:
        command += ["--max-model-len", str(config.max_model_len)]
    if config.enforce_eager:
        command.append("--enforce-eager")
    if config.trust_remote_code:
        command.append("--trust-remote-code")
    if config.enable_lora:
        command += [
            "--enable-lora",
            "--max-lora-rank", str(vllm_lora_rank(config.max_lora_rank or 16)),
            "--max-loras", str(config.max_loras),
            "--max-cpu-loras", str(max(config.max_cpu_loras, config.max_loras)),
        ]  # fmt: skip
    if config.enable_prefix_caching is not None:
        command.append(
            "--enable-prefix-caching" if config.enable_prefix_caching
            else "--no-enable-prefix-caching"
        )  # fmt: skip
    if config.reasoning_parser:
        command += ["--reasoning-parser", config.reasoning_parser]
    if config.enable_auto_tool_choice:
        command.append("--enable-auto-tool-choice")
    if config.tool_call_parser:
        command += ["--tool-call-parser", config.tool_call_parser]
    if config.rope_scaling:
        command += ["--hf-overrides", json.dumps({"rope_scaling": config.rope_scaling})]
    if config.kv_cache_memory_bytes:
        command += ["--kv-cache-memory-bytes", str(config.kv_cache_memory_bytes)]
    if vllm_worker_in_engine_core(config, gpus_possible):
        command += ["--distributed-executor-backend", "uni"]
    if server_key(config.api_key_var):  # every route, not only /v1, needs the key
        command += ["--middleware", ENGINE_GUARD]
    return command + config.extra_args


def vllm_environment(config: InferenceConfig, gpus_possible: bool | None = None) -> dict[str, str]:
    """The RL routes (/pause, /collective_rpc, /reset_prefix_cache) exist only in dev mode
    (guarded by the key with everything else: see the module's docstring); runtime LoRA
    loading needs its own switch; the worker extension reads the weight roots. The key is not
    here: it reaches the guard over a socket (`serve_external`). vLLM's CPU platform
    keeps the `uni` executor only where V1 multiprocessing is off: the API server still starts
    its engine core as a process of its own (its async client always does), and that process
    runs the worker. Eager on a machine with no GPU, torch.compile is off."""
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        WEIGHT_ROOTS_ENV: json.dumps(resolved_roots(config.weight_roots)),
    }
    if vllm_worker_in_engine_core(config, gpus_possible):
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if vllm_compiles_nothing(config, gpus_possible):
        env["TORCHDYNAMO_DISABLE"] = "1"
    if config.enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return env


def engine_environment(overlay: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The engine process's whole environment: ours (`environ`) without the run's secret and
    without an inherited `$VLLM_API_KEY` (the key travels over a socket), plus `overlay`."""
    dropped = {RUN_SECRET_ENV, ENGINE_KEY_ENV, SECRETS_FD_ENV}
    return {**{k: v for k, v in environ.items() if k not in dropped}, **overlay}


def refuse_flags_that_open(config: InferenceConfig) -> None:
    """`extra_args` may not bind the engine elsewhere than `host` (past the loopback check) nor
    put a key on the command line (where `ps` shows it): `host` and `api_key_var` say those.
    vLLM's and SGLang's parsers (argparse) take any unambiguous prefix of a flag (`--hos` is
    `--host`), so a prefix of a refused flag is refused too."""
    for arg in config.extra_args:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--") or flag == "--":
            continue
        flag = "--" + flag[2:].replace("_", "-")  # vLLM's parser reads `--api_key` as `--api-key`
        for refused, key in REFUSED_FLAGS.items():
            if refused.startswith(flag):
                shown = refused if flag == refused else f"{flag} (short for {refused})"
                raise ConfigError(
                    f"inference.extra_args: {shown} is refused; set `inference.{key}` instead "
                    "(the address is checked before the engine starts; the key reaches the "
                    "engine over a private channel, never its command line)"
                )


def sglang_command(config: InferenceConfig, key_file: Path | None = None) -> list[str]:
    """SGLang's command; its API key, if any, in `key_file` (`private_key_file`)."""
    command = [
        config.executable or sys.executable, "-m", "sglang.launch_server",
        "--model-path", config.model,
        "--host", config.host,
        "--port", str(config.port),
        "--dtype", config.dtype,
        "--tp-size", str(config.tp),
        "--dp-size", str(config.dp),
        "--max-running-requests", str(config.max_num_seqs),
        "--mem-fraction-static", str(config.gpu_memory_utilization),
    ]  # fmt: skip
    if config.served_model_name:
        command += ["--served-model-name", config.served_model_name]
    if config.max_model_len:
        command += ["--context-length", str(config.max_model_len)]
    if config.enforce_eager:
        command.append("--disable-cuda-graph")
    if config.trust_remote_code:
        command.append("--trust-remote-code")
    if config.enable_lora:
        command += ["--enable-lora", "--max-loras-per-batch", str(config.max_loras)]
        if config.max_lora_rank:
            command += ["--max-lora-rank", str(config.max_lora_rank)]
    if config.enable_prefix_caching is False:
        command.append("--disable-radix-cache")
    if config.reasoning_parser:
        command += ["--reasoning-parser", config.reasoning_parser]
    if config.tool_call_parser:
        command += ["--tool-call-parser", config.tool_call_parser]
    if config.rope_scaling:
        command += ["--json-model-override-args", json.dumps({"rope_scaling": config.rope_scaling})]
    if key_file is not None:
        command += ["--config", str(key_file)]
    return command + config.extra_args


def private_key_file(key: str) -> Path:
    """A YAML file holding `api-key`, readable by this user only, in a directory of its own."""
    directory = Path(tempfile.mkdtemp(prefix="asyncrl-sglang-"))  # mode 0700
    path = directory / "api-key.yaml"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        yaml.safe_dump({"api-key": key}, handle)
    return path


def engine_command(
    config: InferenceConfig, key_file: Path | None = None
) -> tuple[list[str], dict[str, str]]:
    if config.backend == "vllm":
        return vllm_command(config), vllm_environment(config)
    if config.backend == "sglang":
        return sglang_command(config, key_file), {}
    raise ValueError(f"backend `{config.backend}` is served in this process, not launched")


def serve_external(config: InferenceConfig) -> None:
    """Start the engine, wait until it answers /health, and stay until it or we stop."""
    if config.executable and not Path(config.executable).is_file():
        raise SystemExit(
            f"`inference.executable` {config.executable} does not exist: it must be the Python "
            f"of a venv with {config.backend} installed (`make vllm` makes .venv-vllm)"
        )
    refuse_flags_that_open(config)
    key = server_api_key(config)  # none: refused off loopback
    log_access(config, key)
    config = config.model_copy(update={"dtype": external_engine_dtype(config)})
    key_file = private_key_file(key) if key and config.backend == "sglang" else None
    command, env = engine_command(config, key_file)
    sockets = Path(tempfile.mkdtemp(prefix=f"asyncrl-{config.backend}-ipc-"))  # mode 0700
    # vLLM names its ZeroMQ sockets in the temporary directory and leaves them there when it
    # stops: given one of their own, they go when the server does
    env["VLLM_RPC_BASE_PATH"] = str(sockets)
    logger.info("starting %s: %s", config.backend, " ".join(command))
    handed = {ENGINE_KEY_ENV: key} if key and config.backend == "vllm" else None
    process = start(command, None, engine_environment(env, os.environ), inherit=False, keys=handed)

    def _stop(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    try:
        url = f"http://{'127.0.0.1' if config.host in ('0.0.0.0', '::') else config.host}"
        wait_healthy(f"{url}:{config.port}", process, config.startup_timeout)
        _remove(key_file)  # read at start-up: no copy of the key stays on disk
        logger.info("%s serving %s on %s:%d", config.backend, config.model, url, config.port)
        code = process.wait()
        if code != 0:
            raise SystemExit(f"{config.backend} server exited with code {code}")
    finally:
        _remove(key_file)
        stop(process, grace=30.0)
        shutil.rmtree(sockets, ignore_errors=True)


def _remove(key_file: Path | None) -> None:
    if key_file is not None:
        shutil.rmtree(key_file.parent, ignore_errors=True)
