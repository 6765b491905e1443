"""A GGUF file as an ordinary Hugging Face model directory (safetensors, tokenizer, template).

transformers reads GGUF itself (`from_pretrained(dir, gguf_file=…)`): it dequantizes every
tensor to float, undoes llama.cpp's q/k row permutation and builds the tokenizer and chat
template from the file's metadata. The model it returns is marked quantized and refuses
`save_pretrained`; the same weights in a model built from its config (without the quantization
entry) save as a plain checkpoint that `AutoModelForCausalLM`, vLLM and asyncrl load.

A GGUF file is input like any other: it is read with the `gguf` package's reader (a memory map
and struct parsing, no code runs), its header is checked before transformers sees it, and an
architecture transformers cannot turn into a causal LM is refused by name.

transformers also reads tokenizer files it finds beside the GGUF file (`tokenizer_config.json`
and a `tokenizer.json` there replace the file's own vocabulary). The conversion sees exactly
the GGUF file and the `SIDE_FILES` it is given, through links in a folder of its own, so that
what the output is made from is what its marker (the cache key) records.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.fs import output_directory, write_output_marker
from asyncrl.log import get_logger

logger = get_logger(__name__)

MARKER = "asyncrl-model.json"  # what a converted directory was made from (the cache key)
# GGUF architectures transformers converts but that are not causal LMs
NOT_CAUSAL_LM = {"general", "tokenizer", "t5", "umt5"}
# files beside a GGUF file that transformers may read with it: a conversion is given those
# present (regular files only), and they are part of its cache key
SIDE_FILES = (
    "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "generation_config.json",
)  # fmt: skip


class GGUFError(ValueError):
    """The file is not a GGUF this can convert; the message names it and why."""


@dataclass(frozen=True)
class GGUFHeader:
    architecture: str
    name: str
    tensor_types: dict[str, int]  # quantization type -> tensor count


def read_header(path: Path) -> GGUFHeader:
    """The architecture and tensor types, or GGUFError naming the file."""
    try:
        from gguf import GGUFReader
    except ModuleNotFoundError as error:
        raise GGUFError(
            "reading GGUF files needs the `gguf` package: pip install 'asyncrl[gguf]'"
        ) from error
    check_regular_file(path)
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file (it does not start with the GGUF magic)")
    try:
        reader = GGUFReader(path)
        fields = reader.fields
        architecture = str(fields["general.architecture"].contents())
        name = str(fields["general.name"].contents()) if "general.name" in fields else path.stem
        types: dict[str, int] = {}
        for tensor in reader.tensors:
            types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    except (KeyError, ValueError, IndexError, OSError) as error:
        raise GGUFError(f"{path}: a damaged or truncated GGUF file ({error!r})") from error
    return GGUFHeader(architecture, name, types)


def check_regular_file(path: Path) -> None:
    """GGUFError unless `path` is a regular file: a missing one is named, and a device, pipe
    or directory is refused before anything reads it (`/dev/zero` would hash for ever)."""
    if not path.exists():
        raise GGUFError(f"{path}: no such file; pass the path of a .gguf file")
    if not path.is_file():
        raise GGUFError(
            f"{path} is not a regular file (a directory, device or pipe); pass the path of a "
            ".gguf file"
        )


def side_files_of(gguf_file: Path) -> list[Path]:
    """The `SIDE_FILES` beside `gguf_file` that are regular files."""
    return [gguf_file.parent / name for name in SIDE_FILES if (gguf_file.parent / name).is_file()]


def supported_architectures() -> list[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - NOT_CAUSAL_LM)


def convert_gguf(
    gguf_file: Path,
    output_dir: Path,
    dtype: str = "float32",
    source: dict[str, Any] | None = None,
    beside: dict[str, bytes] | None = None,
    side_files: Sequence[Path] = (),
) -> Path:
    """Write `gguf_file` as a model directory at `output_dir` (atomically: a reader never sees a
    half-written one; `fs.output_directory` refuses an output that holds anything else).
    `source` goes into the directory's marker file beside the file's own description; `beside`
    ({file name: bytes}: the weights' licence, model card) is written with the weights, so the
    terms travel with every copy. transformers sees the GGUF file and `side_files` (some of
    `SIDE_FILES` beside it), nothing else of its folder. Returns `output_dir`."""
    header = read_header(gguf_file)
    if header.architecture not in supported_architectures():
        raise GGUFError(
            f"{gguf_file}: architecture `{header.architecture}` is not one transformers can load "
            f"as a causal LM from GGUF; supported: {', '.join(supported_architectures())}"
        )
    import torch

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    kinds = ", ".join(f"{count} {kind}" for kind, count in header.tensor_types.items())
    read_from = [gguf_file, *side_files]
    with output_directory(
        output_dir, command="get-model", marker=MARKER, sources=read_from
    ) as staging:
        logger.info("get-model: dequantizing %s (%s, %s)", gguf_file, header.architecture, kinds)
        model, tokenizer = _dequantized(gguf_file, side_files, header, torch_dtype)
        parameters = sum(p.numel() for p in model.parameters())
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        for name, data in (beside or {}).items():
            (staging / name).write_bytes(data)
        write_output_marker(staging, MARKER, {
            "source": source or {"gguf": str(gguf_file)},
            "gguf_name": header.name,
            "architecture": header.architecture,
            "quantization": header.tensor_types,
            "dtype": dtype,
            "parameters": parameters,
            "note": "weights dequantized from the GGUF file: they are the quantized model's, "
            "not the original float checkpoint's",
        })  # fmt: skip
    logger.info("get-model: %s (%.1f M parameters) saved to %s", header.name, parameters / 1e6,
                output_dir)  # fmt: skip
    return output_dir


def _dequantized(
    gguf_file: Path, side_files: Sequence[Path], header: GGUFHeader, torch_dtype: Any
) -> tuple[Any, Any]:
    """The model (plain float weights) and tokenizer, read from a folder of links to the GGUF
    file and `side_files` alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="asyncrl-gguf-") as folder:
        for path in (gguf_file, *side_files):
            (Path(folder) / path.name).symlink_to(path.resolve())
        name = gguf_file.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch_dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain floats
    config.name_or_path = header.name
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model, tokenizer
