"""What loading a LoRA adapter in place costs the embedded server, two source trees side by side.

A trainer with `lora: true` broadcasts an adapter after every step and the server loads it in
place (`ServedModel.load_lora`: read, check, merge into the weights on the engine's thread),
on the core the server generates on. This times that load, as a server does it, for each tree
given (`--trees OLD/src NEW/src`), alternating the trees round by round, each round a fresh
process on one core with one torch thread: `--reloads` timed loads of one adapter (rank
`--rank` on every linear layer, random factors, saved with PEFT) after one untimed. Prints one
JSON line: each tree's seconds a reload (mean over rounds) and the first tree's time over each
other's, with a 95 % bootstrap interval over the rounds. A tree without asyncrl, or a round
run on another tree's, stops it (`source_trees.py`).

    python benchmarks/lora_reload.py --model models/smollm2-135m-instruct \
        --trees /tmp/old/src src [--rounds 5] [--reloads 8] [--rank 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name
from race_stats import bootstrap_ratio
from source_trees import check_imported, checked_trees, imported_from

LINEAR_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_adapter(model: str, rank: int, directory: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=LINEAR_LAYERS,
                        init_lora_weights=False)  # fmt: skip
    get_peft_model(base, config).save_pretrained(directory)


def time_reloads(model: str, root: Path, reloads: int) -> dict[str, object]:
    """(in the child, on the tree under test) Seconds for each in-place load of the adapter, and
    where asyncrl was imported from."""
    import torch

    from asyncrl.config.inference import InferenceConfig
    from asyncrl.inference.server import load_served_model

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    config = InferenceConfig(model=model, dtype="float32", max_num_seqs=4, max_model_len=256,
                             enable_lora=True, weight_roots=[str(root)])  # fmt: skip
    served = load_served_model(config)
    adapter = str(root / "adapter")
    served.load_lora("policy", adapter, load_inplace=False, version=1)  # untimed: first copy
    seconds = []
    for version in range(2, reloads + 2):
        start = time.perf_counter()
        served.load_lora("policy", adapter, load_inplace=True, version=version)
        seconds.append(time.perf_counter() - start)
    served.engine.shutdown()
    return {"imported_from": imported_from(), "seconds": seconds}


def parser() -> argparse.ArgumentParser:
    """The command line, built without running anything (tests/unit/test_benchmarks.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--trees", nargs="+", default=["src"], help="source trees to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reloads", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # the root, in a child
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.child is not None:
        print(json.dumps(time_reloads(args.model, args.child, args.reloads)))
        return
    trees = checked_trees(args.trees, "lora_reload")
    per_tree: dict[str, list[float]] = {tree: [] for tree in args.trees}
    benchmarks = str(Path(__file__).resolve().parent)
    with tempfile.TemporaryDirectory(prefix="lora-reload-") as scratch:
        root = Path(scratch)
        save_adapter(args.model, args.rank, root / "adapter")
        for _ in range(args.rounds):
            for name, tree in zip(args.trees, trees, strict=True):
                command = [sys.executable, __file__, "--model", args.model, "--reloads",
                           str(args.reloads), "--child", str(root)]  # fmt: skip
                environment = {**os.environ, "PYTHONPATH": f"{tree}:{benchmarks}"}
                done = subprocess.run(command, env=environment, capture_output=True, text=True)
                if done.returncode != 0:
                    failure = done.stderr[-3000:]
                    raise SystemExit(f"lora_reload: the round on {tree} failed:\n{failure}")
                result = json.loads(done.stdout.splitlines()[-1])
                check_imported(tree, result["imported_from"], "lora_reload")
                per_tree[name].append(statistics.fmean(result["seconds"]))
    first, *others = args.trees
    result: dict[str, object] = {
        "cpu": cpu_name(), "model": args.model, "rank": args.rank, "rounds": args.rounds,
        "reloads": args.reloads,
        "seconds_a_reload": {tree: statistics.fmean(v) for tree, v in per_tree.items()},
    }  # fmt: skip
    for other in others:
        point, low, high = bootstrap_ratio(per_tree[first], per_tree[other])
        result[f"{first} / {other}"] = [round(point, 3), round(low, 3), round(high, 3)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
