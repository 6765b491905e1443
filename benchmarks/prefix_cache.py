"""Multi-turn generation with and without the embedded engine's prefix cache, side by side.

Builds the `small` preset and plays conversations the way a multi-turn environment does: each
turn sends the whole history (a 256-token opening, then every reply and a 16-token user
message) and generates a 32-token reply; 8 conversations at once, 4 turns. With the cache a
turn prefills only what is new since the last. The two engines alternate rounds so machine
noise hits both alike. Prints one JSON line: median seconds per round and tokens prefilled,
each way, and the speedup.

    python benchmarks/prefix_cache.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.init_model import InitModelConfig
from asyncrl.inference.engine import Engine
from asyncrl.inference.sampling import SamplingParams
from asyncrl.models.init_model import init_model
from machine import cpu_name  # benchmarks/machine.py, beside this file

CONVERSATIONS, TURNS, OPENING, USER, REPLY = 8, 4, 256, 16, 32


def play(engine: Engine, rng: random.Random, vocab: int) -> tuple[float, int]:
    """Seconds for every turn of every conversation, and the tokens prefilled."""
    params = SamplingParams(max_tokens=REPLY, temperature=0.0, ignore_eos=True)
    histories = [[rng.randrange(3, vocab) for _ in range(OPENING)] for _ in range(CONVERSATIONS)]
    prefilled = engine.stats.prefill_tokens
    started = time.perf_counter()
    for _ in range(TURNS):
        requests = [engine.submit(history, params) for history in histories]
        for history, request in zip(histories, requests, strict=True):
            [reply] = request.done.result(timeout=600)
            history += reply.token_ids + [rng.randrange(3, vocab) for _ in range(USER)]
    return time.perf_counter() - started, engine.stats.prefill_tokens - prefilled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="asyncrl-prefix-cache-") as temp:
        path = init_model(InitModelConfig(preset="small", output_dir=str(Path(temp) / "model")))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
    vocab = int(model.config.vocab_size)
    length = OPENING + TURNS * (REPLY + USER)
    engines = {
        cached: Engine(model, tokenizer, max_num_seqs=CONVERSATIONS * 2, max_model_len=length,
                       prefix_caching=cached)
        for cached in (False, True)
    }  # fmt: skip
    seconds: dict[bool, list[float]] = {False: [], True: []}
    tokens: dict[bool, int] = {}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for cached in (False, True) if repeat % 2 else (True, False):
            elapsed, tokens[cached] = play(engines[cached], random.Random(repeat), vocab)
            if repeat:
                seconds[cached].append(elapsed)
    for engine in engines.values():
        engine.shutdown()
    plain, cached = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(json.dumps({
        "benchmark": "prefix_cache", "cpu": cpu_name(), "cores": os.cpu_count(),
        "threads": torch.get_num_threads(), "model": "small", "conversations": CONVERSATIONS,
        "turns": TURNS, "opening": OPENING, "user": USER, "reply": REPLY,
        "seconds_uncached": round(plain, 2), "seconds_cached": round(cached, 2),
        "prefill_tokens_uncached": tokens[False], "prefill_tokens_cached": tokens[True],
        "speedup": round(plain / cached, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
