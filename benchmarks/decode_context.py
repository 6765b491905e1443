"""What one long sequence costs every other row of the embedded engine's decode step.

The engine decodes running sequences in batched forward passes through its slot KV cache
(`asyncrl/inference/kv_cache.py`): each layer gathers every row's keys and values up to the
longest sequence in the pass and attends over them under a mask. With long-tailed answer
lengths (`examples/reverse_text_long`) there is nearly always one long sequence in flight, so
in a single pass every row pays for its length (what `inference/decode_plan.py`'s split by
length avoids; its threshold is fitted from these figures). This times one pass (the model's
forward pass alone, one core, bf16 where the CPU has it, as `engine_step.py`'s `bare`) for
`--rows` rows:

- `short`: every row at `--short` tokens of context;
- `one_long`: the same, but one row at `--long` tokens;
- `all_long`: every row at `--long` tokens;

each with the rows in consecutive cache slots (`contiguous`: no gather) and in every other slot
(`scattered`: what slots look like once sequences have come and gone). Rounds alternate the
cases `--repeats` times; the JSON line gives medians in ms and one_long ÷ short with its range.

    python benchmarks/decode_context.py [--preset small] [--rows 32] [--short 40] [--long 500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.init_model import InitModelConfig
from asyncrl.inference.kv_cache import SlotKVCache
from asyncrl.models.init_model import init_model
from asyncrl.precision import resolve_recipe
from machine import cpu_name

STEPS = 20


def step_ms(model: torch.nn.Module, lengths: list[int], scattered: bool) -> float:
    """Milliseconds per decode step for rows at `lengths` tokens of context."""
    config = model.config
    cache = SlotKVCache(
        num_layers=config.num_hidden_layers, num_slots=2 * len(lengths),
        num_kv_heads=config.num_key_value_heads, max_len=max(lengths) + STEPS + 4,
        head_dim=config.hidden_size // config.num_attention_heads,
        dtype=next(model.parameters()).dtype,
    )  # fmt: skip
    slots = list(range(0, 2 * len(lengths), 2)) if scattered else list(range(len(lengths)))
    inputs = torch.zeros(len(lengths), 1, dtype=torch.long)
    with torch.inference_mode():
        for step in range(STEPS + 3):  # the first 3 warm up
            if step == 3:
                started = time.perf_counter()
            cache.prepare(slots, [length + step for length in lengths], 1)
            model(
                input_ids=inputs, position_ids=cache.position_ids(),
                attention_mask=cache.attention_mask(), past_key_values=cache, use_cache=True,
            )  # fmt: skip
    return (time.perf_counter() - started) / STEPS * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--short", type=int, default=40)
    parser.add_argument("--long", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the server's share of a 2-core machine (`thread_budget`)
    # the dtype `recipe: auto` gives the server here (bf16 only where the CPU runs it natively)
    dtype = torch.bfloat16 if resolve_recipe("auto").recipe == "bf16" else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        path = init_model(InitModelConfig(preset=args.preset, output_dir=str(Path(tmp) / "m")))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    cases = {
        "short": [args.short] * args.rows,
        "one_long": [args.long] + [args.short] * (args.rows - 1),
        "all_long": [args.long] * args.rows,
    }
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, lengths in cases.items():
            for layout in ("contiguous", "scattered"):
                times.setdefault(f"{name}_{layout}", []).append(
                    step_ms(model, lengths, layout == "scattered")
                )
    ratios = {
        layout: [
            long / short
            for long, short in zip(
                times[f"one_long_{layout}"], times[f"short_{layout}"], strict=True
            )
        ]
        for layout in ("contiguous", "scattered")
    }
    print(json.dumps({
        "benchmark": "decode_context", "cpu": cpu_name(), "preset": args.preset,
        "dtype": str(dtype).removeprefix("torch."), "rows": args.rows, "short": args.short,
        "long": args.long, "repeats": args.repeats,
        "step_ms": {k: round(statistics.median(v), 2) for k, v in times.items()},
        "one_long_over_short": {
            k: [round(statistics.median(v), 2), round(min(v), 2), round(max(v), 2)]
            for k, v in ratios.items()
        },
    }))  # fmt: skip


if __name__ == "__main__":
    main()
