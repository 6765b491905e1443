"""The embedded engine's decode, two source trees side by side: what a change to the engine's
pass (its layout, its head, its sampler) buys at the shape of an RL step.

For each tree given (`--trees OLD/src NEW/src`) a fresh process loads the model exactly as the
server does (`load_served_model`: the tree's own layout and engine), with malloc tuned as a role
is (`keep_freed_memory`), pinned to one core with one torch thread, and times `--repeats`
rounds after one untimed: `--rows` sequences in groups of 8 sharing a prompt (as the
orchestrator asks), submitted while the engine is paused and released together, `--tokens`
tokens each with EOS ignored, at temperature 0.7, served in
`--dtype` (float32; bfloat16 is what `auto` serves where the CPU has it native). Trees alternate
round by round, `--rounds` times. Prints one JSON line: each tree's tokens per second (median
over its rounds) and the first tree's mean round time over each other's, with a 95 % bootstrap
interval over rounds. A tree without asyncrl, or a round run on another tree's, stops it.

    PYTHONPATH=src:benchmarks python benchmarks/decode_trees.py \
        --model models/smollm2-135m-instruct --trees /tmp/old/src src --rows 40 [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from machine import cpu_name
from race_stats import bootstrap_ratio
from source_trees import check_imported, checked_trees, imported_from

GROUP = 8


def prompts(tokenizer: Any, groups: int) -> list[list[int]]:
    """One chat prompt per group, each a short sum as the quick start asks."""
    texts = [
        f"Write the calculation, then the result in answer tags.\nWhat is {i} + {i + 3}?"
        for i in range(groups)
    ]
    chats = [[{"role": "user", "content": text}] for text in texts]
    return [
        list(
            tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)[
                "input_ids"
            ]
        )
        for chat in chats
    ]


def round_seconds(engine: Any, prompt_ids: list[list[int]], tokens: int) -> float:
    """One round through the engine's public API, from the release of every group to the last
    completion. Imports the sampling parameters of the tree this child runs, so that a tree of
    any age can be timed."""
    import time

    from asyncrl.inference.sampling import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.7, ignore_eos=True, logprobs=0)
    engine.pause("keep")  # held until all are in: one prefill, as a batch of groups arrives
    requests = [engine.submit(ids, params, n=GROUP) for ids in prompt_ids]
    started = time.perf_counter()
    engine.resume()
    for request in requests:
        request.done.result(timeout=600)
    return time.perf_counter() - started


def child(model: str, rows: int, tokens: int, repeats: int, dtype: str) -> dict[str, object]:
    """Round times of this process's tree (imported from PYTHONPATH), and where it was imported
    from (a tree without asyncrl would fall through to the installed one)."""
    from asyncrl.heap import keep_freed_memory

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    keep_freed_memory()
    import torch

    from asyncrl.config.inference import InferenceConfig
    from asyncrl.inference.server import load_served_model

    torch.set_num_threads(1)
    config = InferenceConfig(model=model, dtype=dtype, max_model_len=256, max_num_seqs=128)
    engine = load_served_model(config).engine
    prompt_ids = prompts(engine.tokenizer, max(1, rows // GROUP))
    try:
        times = [round_seconds(engine, prompt_ids, tokens) for _ in range(repeats + 1)]
    finally:
        engine.shutdown()
    return {"imported_from": imported_from(), "seconds": times[1:]}  # the first warms up


def round_times(tree: Path, args: argparse.Namespace, benchmarks: str) -> list[float]:
    """One fresh process's timed rounds on `tree`; its failure or a wrong import says which."""
    environment = os.environ | {"PYTHONPATH": f"{tree}:{benchmarks}"}
    command = [sys.executable, __file__, "--child", "--model", args.model,
               "--rows", str(args.rows), "--tokens", str(args.tokens),
               "--repeats", str(args.repeats), "--dtype", args.dtype]  # fmt: skip
    done = subprocess.run(command, env=environment, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"decode_trees: the round on {tree} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    check_imported(tree, result["imported_from"], "decode_trees")
    return result["seconds"]


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--trees", nargs="+", default=["src"], help="source trees to compare")
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per process")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="what the server serves in (bfloat16: `auto` on a CPU with it native)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.rows, args.tokens, args.repeats, args.dtype)))
        return
    benchmarks = str(Path(__file__).resolve().parent)
    trees = checked_trees(args.trees, "decode_trees")
    per_tree: dict[str, list[float]] = {tree: [] for tree in args.trees}
    for _ in range(args.rounds):
        for name, tree in zip(args.trees, trees, strict=True):
            per_tree[name].extend(round_times(tree, args, benchmarks))
    generated = max(1, args.rows // GROUP) * GROUP * args.tokens
    first, *others = args.trees
    line = {
        "benchmark": "decode_trees", "cpu": cpu_name(), "threads": 1, "model": args.model,
        "dtype": args.dtype,
        "rows": args.rows, "tokens": args.tokens, "rounds": args.rounds, "repeats": args.repeats,
        "tokens_per_s": {tree: round(generated / statistics.median(times), 1)
                         for tree, times in per_tree.items()},
        "speedup_over_first": {
            tree: [round(v, 3) for v in bootstrap_ratio(per_tree[first], per_tree[tree])]
            for tree in others
        },
    }  # fmt: skip
    print(json.dumps(line))


if __name__ == "__main__":
    main()
