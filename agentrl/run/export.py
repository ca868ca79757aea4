"""Hugging Face exports of the policy: ``--save-hf`` at each save of a run, and ``agentrl export``
of a checkpoint a run left behind (no training, one process, no Ray).

An export without LoRA is one Hugging Face folder (weights, config, tokenizer, the run's chat
template). A LoRA run's export holds two models that must not be mixed up, so each has its own
folder and the export says which is which in a ``README.md``::

    <export>/merged/    the trained policy, adapters merged in: a complete Hugging Face folder
                        (transformers, vLLM, ``agentrl eval --hf-checkpoint <export>/merged``)
    <export>/adapter/   the adapters alone in PEFT's format, for the BASE model the run started
                        from (never for merged/, which already holds them)
    <export>/base/      that base model, when it is agentrl's own (the built-in tiny model, a
                        shipped warm start, a converted GGUF file), hard-linked where possible

The adapter's ``base_model_name_or_path`` names no folder of the machine that trained it: a
named model's name (``smollm2-135m-instruct``: ``agentrl models get`` fetches it), ``../base``
for a base saved beside it, or else the base folder's path relative to the adapter folder. These
are agentrl's conventions (PEFT would read a relative path against the working directory and a
name as a Hub id): the export's README shows how to load the base.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from agentrl.chat.templates import load_chat_template
from agentrl.config import from_namespace
from agentrl.errors import ConfigError
from agentrl.models.catalog import NAMED_MODELS, models_dir, named_model_of
from agentrl.run.checkpoints import latest_checkpoint
from agentrl.trainer.config import TrainerConfig

__all__ = ["ADAPTER", "BASE", "MERGED", "AdapterBase", "Export", "adapter_base", "export_hf",
           "export_run"]

MERGED = "merged"
"""A LoRA export's merged model (its subfolder)."""
ADAPTER = "adapter"
"""A LoRA export's adapters, in PEFT's format (its subfolder)."""
BASE = "base"
"""A LoRA export's copy of the base model, when it is agentrl's own (its subfolder)."""

_PACKAGE = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class AdapterBase:
    """What a LoRA export's ``adapter_config.json`` names as its base.

    Attributes:
        name_or_path: PEFT's ``base_model_name_or_path``: a named model, ``../base``, or a path
            relative to the adapter folder.
        copy_from: The folder to save beside the adapter as ``base/`` (``None``: not saved).
    """

    name_or_path: str
    copy_from: Path | None


@dataclasses.dataclass(frozen=True)
class Export:
    """Where an export went.

    Attributes:
        root: The export's folder.
        model: The Hugging Face folder to load: ``root`` itself, or ``root/merged`` with LoRA.
        adapter: The PEFT adapter folder (LoRA only).
    """

    root: Path
    model: Path
    adapter: Path | None = None

    def describe(self) -> str:
        """One phrase for the run's last lines."""
        if self.adapter is None:
            return str(self.root)
        return f"{self.root} (the model: {self.model.name}/; LoRA adapters for the base: {self.adapter.name}/)"


def adapter_base(base_dir: str | Path, adapter_dir: str | Path) -> AdapterBase:
    """The portable name of the base model a LoRA run started from (see the module doc).

    Args:
        base_dir: The Hugging Face folder the run started from.
        adapter_dir: Where the adapter goes (a relative base path is relative to it).
    """
    base = Path(base_dir).expanduser().resolve()
    name = named_model_of(base)
    if name is not None:
        return AdapterBase(name, None)
    owned = (_PACKAGE, models_dir().resolve().parent)  # the package, the agentrl cache
    if any(base.is_relative_to(root) for root in owned):
        return AdapterBase(f"../{BASE}", base)
    return AdapterBase(os.path.relpath(base, Path(adapter_dir).expanduser().resolve()), None)


def export_hf(actor: Any, out_dir: str | Path, checkpoint: str | Path, *,
              chat_template: str | None, lora: bool) -> Export:
    """Writes one export of the actor's policy (a collective, like ``save_hf``).

    Args:
        actor: The trainer (its ranks, or the one in this process).
        out_dir: The export's folder.
        checkpoint: The Hugging Face folder the run started from (its tokenizer; with LoRA the
            adapters' base).
        chat_template: The run's ``--chat-template``, written into the model's folder so that it
            plays as the run played without the flag; ``None``: the tokenizer's own.
        lora: The run trains LoRA adapters: the layout above.
    """
    root = Path(out_dir)
    model = root / MERGED if lora else root
    actor.save_hf(model, tokenizer_dir=checkpoint)
    if chat_template is not None:
        (model / "chat_template.jinja").write_text(load_chat_template(chat_template)[1], encoding="utf-8")
    if not lora:
        return Export(root, model)
    adapter = root / ADAPTER
    base = adapter_base(checkpoint, adapter)
    actor.save_adapter(adapter, base_model=base.name_or_path)
    if base.copy_from is not None:
        _link_tree(base.copy_from, root / BASE)
    (root / "README.md").write_text(_readme(base), encoding="utf-8")
    return Export(root, model, adapter)


def export_run(run: str | Path, out_dir: str | Path, *, checkpoint: str | Path | None = None) -> Export:
    """``agentrl export``: the newest complete checkpoint of a run (or ``checkpoint``) exported
    as ``--save-hf`` would have, by a trainer in this process at tensor-parallel size 1 (Megatron's
    distributed checkpoints reshard; the model, its optimizer state included, must fit in this
    process). Paths the run was given relative to where it started are read from there.

    Args:
        run: The run's folder (its ``run.json`` says which model and flags it trained with), or
            its checkpoint folder, or one checkpoint in it.
        out_dir: The export's folder.
        checkpoint: A checkpoint, or a ``--save`` folder, to export instead of the run's newest.

    Raises:
        ConfigError: No run, no checkpoint, the model the run started from is gone, or
            ``out_dir`` is not empty; says what to pass.
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"agentrl export: --hf {out} is not empty: give a new folder (an export "
                          "never writes over another)")
    run_dir, launch = _last_launch(Path(run).absolute())
    flags = dict(launch.get("flags") or {})
    started_in = Path(launch.get("cwd") or run_dir)  # what relative paths of the launch meant

    def launched(path: str | None) -> str | None:
        return None if path is None else str(started_in / Path(path).expanduser())

    base = launched(launch.get("policy_dir"))
    if not base or not (Path(base) / "config.json").is_file():
        raise ConfigError(f"agentrl export: the model run {run_dir} started from ({base}) is not "
                          "there any more: fetch or restore it at that path first")
    if checkpoint is None:
        given = Path(run).absolute()
        checkpoint = given if given != run_dir else Path(launched(flags.get("save")) or run_dir / "checkpoints")
    folder = latest_checkpoint(checkpoint, flag="agentrl export")
    template = flags.get("chat_template")
    if template is not None and Path(launched(template) or "").is_file():
        template = launched(template)  # a file named relative to where the run started
    config = from_namespace(TrainerConfig, argparse.Namespace(**flags), tensor_model_parallel_size=1,
                            sequence_parallel=False, load=None, save=None, save_hf=None)
    from agentrl.trainer.actor import MegatronActor  # megatron-core, torch: only here

    actor = MegatronActor(config, hf_checkpoint=base)
    actor.load_checkpoint(folder)
    return export_hf(actor, out, base, chat_template=template, lora=bool(config.lora_rank))


def _last_launch(path: Path) -> tuple[Path, dict[str, Any]]:
    """The run folder at or above ``path`` (a run, its checkpoints, one checkpoint) and the last
    launch its ``run.json`` records."""
    for folder in (path, path.parent, path.parent.parent):
        record = folder / "run.json"
        if record.is_file():
            try:
                return folder, json.loads(record.read_text(encoding="utf-8"))["launches"][-1]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise ConfigError(f"agentrl export: {record} cannot be read ({exc}): it is the "
                                  "run's record of its model and flags") from None
    raise ConfigError(f"agentrl export: no run.json in {path} or above it: pass the folder of a "
                      "run train.py made (its --output-dir), with --checkpoint for checkpoints it "
                      "saved elsewhere (--save)")


def _link_tree(source: Path, target: Path) -> None:
    """Copies a model folder, hard-linking its files where the file system allows (a base
    model saved beside every export costs no space)."""
    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    if target.exists():  # an earlier export's copy: replaced whole (its files may be links to source)
        shutil.rmtree(target)
    shutil.copytree(source, target, copy_function=link_or_copy)


def _readme(base: AdapterBase) -> str:
    if base.copy_from is not None:
        where = (f"`{BASE}/` beside it: agentrl's own model the run started from, saved here "
                 f"(the adapter names it as `{base.name_or_path}`, relative to `{ADAPTER}/`)")
        load_base = f'"{BASE}"'
    elif base.name_or_path in NAMED_MODELS:
        where = (f"the named model `{base.name_or_path}`: `agentrl models get {base.name_or_path}` "
                 "fetches it and prints its folder")
        load_base = f'get_model("{base.name_or_path}")'
    else:
        where = (f"the folder `{base.name_or_path}`, relative to `{ADAPTER}/` (the model the "
                 "run started from)")
        load_base = f'"{ADAPTER}/{base.name_or_path}"'
    imports = ("from agentrl.models.catalog import get_model  # fetches and converts it once\n"
               if base.name_or_path in NAMED_MODELS and base.copy_from is None else "")
    return f"""# A LoRA run's export (agentrl)

- `{MERGED}/`: the trained policy, the adapters merged into its weights. A complete Hugging Face
  folder: load it as it is (transformers, vLLM, `agentrl eval --hf-checkpoint <this folder>/{MERGED}`).
  It already holds the adapters: do not load `{ADAPTER}/` onto it.
- `{ADAPTER}/`: the adapters alone, in PEFT's format, for the base model: {where}.

The same policy from the base and the adapters (run in this folder):

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM
{imports}
base = AutoModelForCausalLM.from_pretrained({load_base})
policy = PeftModel.from_pretrained(base, "{ADAPTER}")  # equals {MERGED}/
```
"""

