"""Run as a script: peak RSS growth of one forward + backward through `completion_logprobs`.

    python memory_probe.py CHUNK   (CHUNK = tokens per chunk, or 0 for the unchunked path)

Prints the growth in bytes of the process's peak resident set over the pass. Each measurement
needs its own process because the peak never goes back down.
"""

from __future__ import annotations

import resource
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from asyncrl.trainer.logprobs import completion_logprobs
from asyncrl.trainer.packing import Sample, collate_rows

TOKENS, VOCAB = 4096, 32768


def main(chunk: int) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=TOKENS,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, VOCAB, (TOKENS,)).tolist()
    batch = collate_rows([[0]], [Sample(ids, [False] + [True] * (TOKENS - 1))], TOKENS, 0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    logprobs = completion_logprobs(model, batch, chunk_size=chunk or None).logprobs
    logprobs.sum().backward()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(after - before)


if __name__ == "__main__":
    main(int(sys.argv[1]))
