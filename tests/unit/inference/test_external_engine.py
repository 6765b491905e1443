"""Inference keys map to vLLM's and SGLang's own flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config.inference import InferenceConfig
from asyncrl.inference.external_engine import (
    engine_command,
    serve_external,
    sglang_command,
    vllm_command,
    vllm_environment,
    vllm_lora_rank,
)


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_every_vllm_key_reaches_its_flag() -> None:
    config = InferenceConfig(
        model="org/model", backend="vllm", executable="/venv/bin/python", host="0.0.0.0",
        port=9001, dtype="bfloat16", tp=2, dp=3, max_model_len=4096, enforce_eager=True,
        trust_remote_code=True, max_lora_rank=24, max_loras=4, max_cpu_loras=2,
        enable_prefix_caching=False, gpu_memory_utilization=0.5, reasoning_parser="deepseek_r1",
        enable_auto_tool_choice=True, tool_call_parser="hermes",
        rope_scaling={"rope_type": "yarn", "factor": 4.0}, kv_cache_memory_bytes=1 << 27,
        extra_args=["--seed", "3"],
    )  # fmt: skip
    command = vllm_command(config)
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    expected = {
        "--model": "org/model", "--host": "0.0.0.0", "--port": "9001", "--dtype": "bfloat16",
        "--tensor-parallel-size": "2", "--data-parallel-size": "3", "--max-model-len": "4096",
        "--max-lora-rank": "32", "--max-loras": "4", "--max-cpu-loras": "4",
        "--gpu-memory-utilization": "0.5", "--reasoning-parser": "deepseek_r1",
        "--tool-call-parser": "hermes", "--logprobs-mode": "processed_logprobs",
        "--hf-overrides": '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}',
        "--kv-cache-memory-bytes": str(1 << 27), "--seed": "3",
    }  # fmt: skip
    assert {name: flag(command, name) for name in expected} == expected
    for switch in ("--enforce-eager", "--trust-remote-code", "--enable-lora",
                   "--no-enable-prefix-caching", "--enable-auto-tool-choice"):  # fmt: skip
        assert switch in command


def test_defaults_leave_optional_vllm_flags_out() -> None:
    command = vllm_command(InferenceConfig(model="m", backend="vllm", enable_lora=False))
    for absent in ("--enable-lora", "--max-model-len", "--enforce-eager", "--hf-overrides",
                   "--enable-prefix-caching", "--no-enable-prefix-caching"):  # fmt: skip
        assert absent not in command


def test_without_a_gpu_one_rank_runs_its_worker_in_the_engine_core_process() -> None:
    config = InferenceConfig(model="m", backend="vllm")
    command = vllm_command(config, gpus_possible=False)
    assert flag(command, "--distributed-executor-backend") == "uni"
    assert vllm_environment(config, gpus_possible=False)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


@pytest.mark.parametrize(
    ("gpus_possible", "update"),
    [
        (True, {}),  # vLLM's own choice on GPUs: uni for one rank already
        (False, {"tp": 2}),  # ranks need processes of their own
        (False, {"dp": 2}),
        (False, {"extra_args": ["--distributed-executor-backend", "mp"]}),  # the user's word
    ],
)
def test_vllms_executor_is_left_to_vllm_where_one_process_would_not_do(
    gpus_possible: bool, update: dict
) -> None:
    config = InferenceConfig(model="m", backend="vllm", **update)
    command = vllm_command(config, gpus_possible=gpus_possible)
    assert command.count("--distributed-executor-backend") == len(config.extra_args) // 2
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in vllm_environment(config, gpus_possible)


def test_eager_without_a_gpu_vllm_compiles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    eager = InferenceConfig(model="m", backend="vllm", enforce_eager=True)
    assert vllm_environment(eager, gpus_possible=False)["TORCHDYNAMO_DISABLE"] == "1"
    # compiling is vLLM's to decide where eager was not asked for, or on GPUs (where, vLLM's
    # comment says, its rank count run eager copies [sequences × vocabulary] tensors: memory)
    compiled = InferenceConfig(model="m", backend="vllm", enforce_eager=False)
    assert "TORCHDYNAMO_DISABLE" not in vllm_environment(compiled, gpus_possible=False)
    assert "TORCHDYNAMO_DISABLE" not in vllm_environment(eager, gpus_possible=True)
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")  # the user's own setting is left alone
    assert "TORCHDYNAMO_DISABLE" not in vllm_environment(eager, gpus_possible=False)


@pytest.mark.parametrize(("rank", "allowed"), [(1, 1), (2, 8), (8, 8), (9, 16), (300, 320)])
def test_lora_rank_rounds_up_to_a_rank_vllm_accepts(rank: int, allowed: int) -> None:
    assert vllm_lora_rank(rank) == allowed


def test_lora_rank_above_vllms_largest_is_an_error() -> None:
    with pytest.raises(ValueError, match="above vLLM's largest"):
        vllm_lora_rank(1024)


def test_the_api_key_is_neither_on_vllms_command_line_nor_in_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It travels over a socket to asyncrl's guard (`test_server_access.py`); the environment
    shows it in `/proc/<pid>/environ` for the server's whole life."""
    monkeypatch.setenv("MY_KEY", "s3cret")
    config = InferenceConfig(model="m", backend="vllm", api_key_var="MY_KEY")
    command, env = engine_command(config)
    assert "s3cret" not in " ".join(command) and "s3cret" not in env.values()
    assert env["VLLM_SERVER_DEV_MODE"] == "1"


def test_sglang_flags() -> None:
    config = InferenceConfig(
        model="m", backend="sglang", tp=2, max_model_len=2048, enforce_eager=True,
        enable_prefix_caching=False, max_num_seqs=64,
    )  # fmt: skip
    command = sglang_command(config)
    assert command[1:3] == ["-m", "sglang.launch_server"]
    assert flag(command, "--model-path") == "m" and flag(command, "--tp-size") == "2"
    assert flag(command, "--context-length") == "2048"
    assert flag(command, "--max-running-requests") == "64"
    assert "--disable-cuda-graph" in command and "--disable-radix-cache" in command


def test_the_embedded_backend_is_not_launched() -> None:
    with pytest.raises(ValueError, match="served in this process"):
        engine_command(InferenceConfig(model="m"))


def test_a_missing_engine_interpreter_names_the_key(tmp_path: Path) -> None:
    missing = tmp_path / "no-venv" / "bin" / "python"
    config = InferenceConfig(model="m", backend="vllm", executable=str(missing))
    with pytest.raises(SystemExit, match=r"`inference.executable` .*no-venv.* does not exist"):
        serve_external(config)


def test_the_sglang_key_goes_in_a_file_only_its_user_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.inference.external_engine import private_key_file

    monkeypatch.setenv("MY_KEY", "s3cret")
    config = InferenceConfig(model="m", backend="sglang", api_key_var="MY_KEY")
    key_file = private_key_file("s3cret")
    try:
        command, _ = engine_command(config, key_file)
        assert "s3cret" not in " ".join(command) and flag(command, "--config") == str(key_file)
        assert key_file.read_text() == "api-key: s3cret\n"
        assert key_file.stat().st_mode & 0o777 == 0o600
        assert key_file.parent.stat().st_mode & 0o777 == 0o700
    finally:
        key_file.unlink()
        key_file.parent.rmdir()
