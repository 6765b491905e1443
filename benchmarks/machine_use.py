"""How much of two cores an `asyncrl rl` run turns into useful work, and where the rest goes.

One run of a config (the real-model quick start by default), and around it, on the same machine:

- **the ceiling**: one-thread fp32 matmuls at the model's own linear shapes, each as often as a
  token's pass has it, one process pinned to each core, both at once, before and after the run;
  the two-core ceiling is the sum of the two cores' rates with 512 rows (training) in the precision
  the trainer ran (float32 or bfloat16), the decode rate (32 rows) and bfloat16 beside where the
  CPU runs it natively;
- **useful FLOP/s of each role over the run's steady part** (from the end of the trainer's first
  step to its last), counted from the model's shapes and the tokens each processed, matmuls only:
  the trainer's from the batches it trained (the samples it computed: not those whose advantages
  are all 0; shared prompts once, 2 passes over the frozen base
  under LoRA, 3 in full fine-tuning, the LM head on loss tokens), the engine's from its
  `/metrics` counters (prefilled and generated tokens; the head once per generated token; the
  embedded engine's: vLLM's in-process engine does not count prefilled tokens);
- **each role's time**: busy (its compute thread's CPU time, from /proc), waiting (the trainer for
  batches, the engine with nothing to run), and its rate while busy against its rate **alone**:
  after the run the trainer retrains the run's own batches pinned to its core with nothing beside
  it, and the engine, alone on its core, answers the run's own prompts with the run's sampling.

Also the engine's generated tokens per step (about the rows of a decode pass) in the run and alone,
and the share of generated tokens that reached a trained batch (the rest were in dropped groups),
and machine use with the engine's work counted in that share only.
Prints one JSON line. Roles are placed by `asyncrl rl` itself (a core each on a 2-core machine).

    python benchmarks/machine_use.py --model models/smollm2-135m-instruct --steps 20 [--fp32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import httpx
import torch
import yaml

from asyncrl.config.trainer import LossConfig
from asyncrl.launch.inference_process import free_port, inference_server
from asyncrl.monitor.metrics import read_headers, read_metrics
from asyncrl.precision import resolve_recipe
from asyncrl.trainer.zero_advantage import samples_to_compute
from asyncrl.transport.batches import read_batch
from asyncrl.types import TrainingBatch
from machine import cpu_name

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# the model's shapes ---------------------------------------------------------------------------
def linear_shapes(model_dir: Path) -> tuple[int, int, dict[str, int]]:
    """(decoder linear parameters, LM head parameters, how often each (in, out) linear shape
    occurs in one token's pass, the head included), from the config alone (a model on the meta
    device: any architecture transformers knows)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    body, shapes = 0, Counter()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            shapes[f"{module.in_features}x{module.out_features}"] += 1
            body += 0 if module is head else module.weight.numel()
    return body, head.weight.numel(), dict(shapes)


CEILING_SCRIPT = """
import json, os, sys, time, torch
core, shapes, dtype = int(sys.argv[1]), json.loads(sys.argv[2]), getattr(torch, sys.argv[3])
os.sched_setaffinity(0, {core})
torch.set_num_threads(1)
rates = {}
for rows in (512, 32):
    flops = seconds = 0.0
    for shape, count in shapes.items():
        k, n = map(int, shape.split("x"))
        a, b = torch.randn(rows, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        repeats = max(1, int(2e8 / (rows * k * n)))
        times = []
        for attempt in range(8):
            started = time.perf_counter()
            for _ in range(repeats):
                a @ b
            times.append(time.perf_counter() - started)
        flops += count * 2 * rows * k * n
        seconds += count * min(times[1:]) / repeats
    rates[str(rows)] = flops / seconds / 1e9
print(json.dumps(rates))
"""


def ceiling(
    shapes: dict[str, int], cores: list[int], dtypes: tuple[str, ...]
) -> dict[str, dict[str, list[float]]]:
    """Each core's one-thread GFLOP/s over one pass through the model's linear layers (each shape
    as often as the model has it), 512 rows (training) and 32 (decode), in each of `dtypes`,
    every core measured at the same time: the rate a role would reach if its matmuls were all
    it did."""
    rates: dict[str, dict[str, list[float]]] = {}
    for dtype in dtypes:
        runs = [subprocess.Popen([sys.executable, "-c", CEILING_SCRIPT, str(core),
                                  json.dumps(shapes), dtype], stdout=subprocess.PIPE, text=True)
                for core in cores]  # fmt: skip
        measured = [json.loads(run.communicate()[0]) for run in runs]
        rates[dtype] = {rows: [round(r[rows], 1) for r in measured] for rows in ("512", "32")}
    return rates


# the run --------------------------------------------------------------------------------------
def role_threads() -> dict[str, dict[str, float]]:
    """CPU seconds of every thread of the run's role processes, by role and thread name."""
    found: dict[str, dict[str, float]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        role = re.search(r"asyncrl\.cli (train|infer|orch) ", command)
        if role is None:
            continue
        threads = found.setdefault(role[1], {})
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
            key = "main" if tid == pid else name
            threads[key] = threads.get(key, 0.0) + seconds
    return found


def server_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=2) as response:
        text = response.read().decode()
    names = (
        "generation_tokens_total",
        "prefill_tokens_total",
        "engine_busy_seconds_total",
        "engine_steps_total",
    )
    return {name: float(re.search(rf"^asyncrl:{name}\S* (\S+)$", text, re.M)[1])  # type: ignore[index]
            for name in names}  # fmt: skip


def run_and_watch(config: dict, workdir: Path) -> tuple[dict, dict, float]:
    """Run `asyncrl rl`; the role threads' CPU seconds and the server's counters at the start and
    the end of the steady part, and its length in seconds."""
    path = workdir / "rl.yaml"
    path.write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{config['inference']['port']}"
    metrics = Path(config["output_dir"]) / "run_default" / "metrics.jsonl"
    run = subprocess.Popen([sys.executable, "-m", "asyncrl.cli", "rl", str(path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    start: dict | None = None
    last: dict | None = None
    threads: dict[str, dict[str, float]] = {}  # the latest reading of each role (CPU only grows)
    counters: dict[str, float] = {}
    trained = 0
    while run.poll() is None:
        time.sleep(0.25)
        for role, reading in role_threads().items():  # CPU time only grows: an exiting
            seen = threads.setdefault(role, {})  # process (a zombie reads 0) changes nothing
            for name, seconds in reading.items():
                seen[name] = max(seen.get(name, 0.0), seconds)
        with contextlib.suppress(OSError):  # the server is shutting down: the run is over
            counters = server_counters(url)
        records = read_metrics(metrics, role="trainer") if metrics.exists() else []
        steps = [record["step"] for record in records]
        if not steps or max(steps) == trained or not counters:
            continue
        trained = max(steps)
        snapshot = {"time": time.monotonic(), "threads": copy.deepcopy(threads),
                    "server": dict(counters), "step": trained}  # fmt: skip
        if start is None:
            start = snapshot
        last = snapshot
    if run.wait() != 0:
        raise SystemExit(f"asyncrl rl failed: see {config['output_dir']}/logs")
    assert start is not None and last is not None and last["step"] > start["step"]
    return start, last, last["time"] - start["time"]


def batch_flops(
    batch: TrainingBatch, body: int, head: int, lora: bool, loss: LossConfig | None = None
) -> float:
    """The matmul FLOPs of training `batch`: the samples the trainer computes (not those whose
    advantages are all 0, `trainer/zero_advantage.py`), shared prompts once each."""
    computed = [batch.samples[i] for i in samples_to_compute(batch, loss or LossConfig())]
    prompts = {tuple(s.prompt_ids) for s in computed}  # shared prefixes: once each
    tokens = sum(map(len, prompts)) + sum(len(s.completion_ids) for s in computed)
    loss_tokens = sum(sum(s.completion_mask) for s in computed)
    return (2 if lora else 3) * 2 * (body * tokens + head * loss_tokens)


def engine_flops(counters: dict[str, float], body: int, head: int) -> float:
    prefill, generated = counters["prefill_tokens_total"], counters["generation_tokens_total"]
    return 2 * (body * (prefill + generated) + head * generated)


def difference(end: dict[str, float], start: dict[str, float]) -> dict[str, float]:
    return {key: end[key] - start.get(key, 0.0) for key in end}


# each role alone ------------------------------------------------------------------------------
def trainer_alone(config: dict, batches: list[TrainingBatch], core: int) -> float:
    """Seconds to train `batches` with the run's trainer settings, one thread on `core`."""
    from asyncrl.config.trainer import TrainerConfig
    from asyncrl.trainer.optim import build_optimizer, build_scheduler
    from asyncrl.trainer.parallel import SINGLE_PROCESS
    from asyncrl.trainer.train import build_policy, this_ranks_micro_batches, train_step

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    section = {k: v for k, v in config["trainer"].items() if k not in ("output_dir",)}
    trainer = TrainerConfig(model=config["model"], sequence_len=config["seq_len"], **section)
    model, reference = build_policy(trainer, SINGLE_PROCESS)
    optimizer = build_optimizer(model, trainer)
    scheduler = build_scheduler(optimizer, trainer, len(batches) + 1)
    micro = [this_ranks_micro_batches(b, trainer, SINGLE_PROCESS, 0) for b in batches]
    train_step(model, reference, optimizer, scheduler, micro[0], trainer, 0)  # warm-up
    started = time.perf_counter()
    for step, micro_batches in enumerate(micro, 1):
        train_step(model, reference, optimizer, scheduler, micro_batches, trainer, step)
    return time.perf_counter() - started


async def _ask(url: str, batches: list[TrainingBatch], sampling: dict, n: int) -> None:
    groups = {tuple(s.prompt_ids) for b in batches for s in b.samples}
    body = {"n": n, "temperature": sampling.get("temperature", 1.0), "logprobs": 0,
            "max_tokens": sampling["max_tokens"], "return_token_ids": True}  # fmt: skip
    async with httpx.AsyncClient(base_url=url, timeout=1200) as client:
        for batch in batches:  # a batch's groups at once, as the orchestrator sends them
            prompts = list(dict.fromkeys(tuple(s.prompt_ids) for s in batch.samples))
            answers = await asyncio.gather(*[
                client.post("/v1/completions", json={**body, "prompt": list(p)}) for p in prompts
            ])  # fmt: skip
            assert all(a.status_code == 200 for a in answers), answers[0].text[:200]
    assert groups


def engine_alone(config: dict, batches: list[TrainingBatch], core: int, dtype: str) -> dict:
    """The server alone on `core` answering the run's prompts with its sampling: its counters."""
    env = {"OMP_NUM_THREADS": "1", "ASYNCRL_CPUS": str(core)}
    orchestrator = config["orchestrator"]
    with inference_server(config["model"], "--max_model_len", str(config["seq_len"]),
                          "--max_num_seqs", "128", "--dtype", dtype, env=env,
                          startup_timeout=600) as url:  # fmt: skip
        asyncio.run(_ask(url, batches[:1], orchestrator["sampling"], 2))  # warm-up
        before = server_counters(url)
        asyncio.run(_ask(url, batches, orchestrator["sampling"],
                         orchestrator["rollouts_per_example"]))  # fmt: skip
        return difference(server_counters(url), before)


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=Path("examples/smollm2_chain_sum/rl.yaml"))
    parser.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fp32", action="store_true", help="fp32 everywhere (what Zen 3 runs)")
    parser.add_argument("--replay", type=int, default=4, help="batches replayed alone per role")
    return parser


def main() -> None:
    args = parser().parse_args()
    cores = sorted(os.sched_getaffinity(0))[:2]
    body, head, shapes = linear_shapes(args.model)
    # bfloat16 beside float32 only where it is native: where it is not (Zen 3: ~60x slower),
    # `auto` never runs it, and its ceiling took minutes to measure, twice
    native = resolve_recipe("auto").recipe == "bf16"
    dtypes = ("float32",) if args.fp32 or not native else ("float32", "bfloat16")
    ceiling_before = ceiling(shapes, cores, dtypes)
    with tempfile.TemporaryDirectory() as workdir:
        config = yaml.safe_load(args.config.read_text())
        config.update(model=str(args.model), output_dir=f"{workdir}/rl", max_steps=args.steps)
        config["inference"]["port"] = free_port()
        config["orchestrator"]["eval"] = None  # generation for training only: what is counted
        if args.fp32:
            config["trainer"]["recipe"] = "fp32"
            config["inference"]["dtype"] = "float32"
        start, end, span = run_and_watch(config, Path(workdir))
        run_dir = Path(config["output_dir"]) / "run_default"
        lora = bool(config["trainer"].get("lora"))
        loss = LossConfig(**config["trainer"].get("loss", {}))
        steps = range(start["step"] + 1, end["step"] + 1)
        batches = [read_batch(run_dir, step) for step in steps]
        trainer_work = sum(batch_flops(b, body, head, lora, loss) for b in batches)
        server = difference(end["server"], start["server"])
        engine_work = engine_flops(server, body, head)
        train_cpu = end["threads"]["train"]["main"] - start["threads"]["train"]["main"]
        engine_busy = server["engine_busy_seconds_total"]
        records = [r for r in read_metrics(run_dir / "metrics.jsonl", role="trainer")
                   if r["step"] in steps]  # fmt: skip
        train_seconds = sum(r["trainer/time/train"] for r in records)
        waited = sum(r["trainer/time/wait_batch"] for r in records)
        replay = batches[: args.replay]
        # each role alone as the run had it: the trainer's resolved recipe, the server's dtype
        config["trainer"]["recipe"] = read_headers(run_dir / "metrics.jsonl", role="trainer")[0][
            "precision/recipe"
        ]
        served = yaml.safe_load((Path(config["output_dir"]) / "configs" / "infer.yaml").read_text())
        dtype = served.get("dtype", "auto")
        alone_train = trainer_alone(config, replay, cores[0])
        alone_engine = engine_alone(config, replay, cores[-1], dtype)
    ceiling_after = ceiling(shapes, cores, dtypes)
    precision = "bfloat16" if config["trainer"]["recipe"] == "bf16" else "float32"
    pairs = zip(ceiling_before[precision]["512"], ceiling_after[precision]["512"], strict=True)
    two_core = sum(max(before, after) for before, after in pairs)
    trainer_rate = trainer_work / span / 1e9
    engine_rate = engine_work / span / 1e9
    replayed_work = sum(batch_flops(b, body, head, lora, loss) for b in replay)
    alone_busy = alone_engine["engine_busy_seconds_total"]
    trained_tokens = sum(len(s.completion_ids) for b in batches for s in b.samples)
    trained_share = trained_tokens / server["generation_tokens_total"]
    print(json.dumps({
        "benchmark": "machine_use", "cpu": cpu_name(), "config": str(args.config),
        "fp32": args.fp32, "steady_steps": len(batches), "steady_seconds": round(span, 1),
        "seconds_per_step": round(span / len(batches), 2),
        "ceiling_gflop_s": {"before": ceiling_before, "after": ceiling_after,
                            "two_core_512_rows": round(two_core, 1), "precision": precision},
        "trainer": {"useful_gflop_s": round(trainer_rate, 1),
                    "busy_share": round(train_cpu / span, 3),
                    "train_share": round(train_seconds / span, 3),
                    "wait_share": round(waited / span, 3),
                    "gflop_s_while_training": round(trainer_work / train_seconds / 1e9, 1),
                    "gflop_s_alone": round(replayed_work / alone_train / 1e9, 1)},
        "engine": {"useful_gflop_s": round(engine_rate, 1),
                   "busy_share": round(engine_busy / span, 3),
                   "gflop_s_while_busy": round(engine_work / engine_busy / 1e9, 1),
                   "gflop_s_alone": round(engine_flops(alone_engine, body, head)
                                          / alone_busy / 1e9, 1),
                   "tokens_per_busy_s": round(server["generation_tokens_total"] / engine_busy, 1),
                   "tokens_per_busy_s_alone": round(
                       alone_engine["generation_tokens_total"] / alone_busy, 1),
                   # ~ rows a decode pass: a step is one pass, its prefilled rows' first tokens
                   "tokens_per_step": round(
                       server["generation_tokens_total"] / server["engine_steps_total"], 1),
                   "tokens_per_step_alone": round(
                       alone_engine["generation_tokens_total"]
                       / alone_engine["engine_steps_total"], 1),
                   # generated tokens that reached a trained batch (the rest: dropped groups)
                   "trained_token_share": round(trained_share, 3)},
        "machine_use": round((trainer_rate + engine_rate) / two_core, 3),
        # the engine's work counted only in the share that reached a batch (prefill included
        # pro rata): what oversampling's dropped groups take back from the figure above
        "machine_use_trained_tokens": round(
            (trainer_rate + engine_rate * trained_share) / two_core, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
