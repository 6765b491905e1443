"""The trainer's LM head and loss-token softmax: plain torch against `trainer/token_softmax.py`.

One thread (the trainer's share of two cores). A chunk of `--tokens` loss tokens' hidden states
through an LM head of the model's shape (SmolLM2-135M: 576 → 49,152, tied embeddings aside),
then log p(target) and the entropy at a per-token temperature, then backward into the head's
input (and its weight with `--train-head`; LoRA, the quick start's, leaves it frozen): what
`trainer/logprobs.py` runs per micro-batch. "plain" is the composite
formula the trainer used before (`/ T`, `logsumexp`, `gather`, `softmax`, `(p · z).sum`);
"few_pass" is `token_logprob_entropy`. The two alternate, `--rounds` timed calls each per
round; prints one JSON line with each one's median seconds, and plain's mean over few_pass's
with a 95 % bootstrap interval over rounds.

    PYTHONPATH=src:benchmarks python benchmarks/token_softmax.py [--tokens 256] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from asyncrl.trainer.token_softmax import token_logprob_entropy
from machine import cpu_name
from race_stats import bootstrap_ratio


def plain(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor):  # type: ignore[no-untyped-def]
    logits = logits.float() / temperature.unsqueeze(-1)
    normaliser = torch.logsumexp(logits, dim=-1)
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = normaliser - (probs * logits).sum(-1)
    return picked - normaliser, entropy


def one_pass(head: torch.nn.Linear, hidden: torch.Tensor, targets, temperature, softmax) -> float:  # type: ignore[no-untyped-def]
    hidden = hidden.detach().requires_grad_(True)
    started = time.perf_counter()
    logprob, _entropy = softmax(head(hidden), targets, temperature)
    logprob.sum().backward()
    elapsed = time.perf_counter() - started
    head.weight.grad = None
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--train-head", action="store_true", help="full fine-tuning's head")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    head.weight.requires_grad_(args.train_head)
    hidden = torch.randn(args.tokens, args.hidden)
    targets = torch.randint(0, args.vocab, (args.tokens,))
    temperature = torch.full((args.tokens,), 0.7)
    ways = {"plain": plain, "few_pass": token_logprob_entropy}
    for softmax in ways.values():  # warm-up: allocations and kernels
        one_pass(head, hidden, targets, temperature, softmax)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, softmax in ways.items():
            seconds[name].append(one_pass(head, hidden, targets, temperature, softmax))
    ratio, low, high = bootstrap_ratio(seconds["plain"], seconds["few_pass"])
    print(json.dumps({
        "benchmark": "token_softmax", "cpu": cpu_name(), "tokens": args.tokens,
        "vocab": args.vocab, "hidden": args.hidden, "train_head": args.train_head,
        "rounds": args.rounds,
        "plain_s": round(statistics.median(seconds["plain"]), 4),
        "few_pass_s": round(statistics.median(seconds["few_pass"]), 4),
        "speedup": round(ratio, 3), "speedup_95": [round(low, 3), round(high, 3)],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
