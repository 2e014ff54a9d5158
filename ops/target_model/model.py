"""The target model: what its config says, where it goes, loading it.

Sits before the forward (forward.py): extract, online training and export load it here. The config is read without loading weights, so
the layer ids and the disk preflight are checked before a 20-minute load.
Placement: one GPU per process (torchrun: rank r on cuda:LOCAL_RANK), the
whole model spread over the GPUs with device_map="auto" when it does not fit
one (then one process only), the CPU when there is no CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ops.common import BadInput

# Share of one GPU's memory the weights may take before we spread the model;
# the rest holds activations of a token-budget batch.
_FITS_ONE_GPU = 0.8


@dataclass(frozen=True)
class TargetInfo:
    path: Path
    architecture: str | None
    model_type: str | None
    num_layers: int
    hidden_size: int
    vocab_size: int | None
    dtype: str | None          # the checkpoint's dtype as config.json says
    weight_bytes: int


def read_target(path: Path) -> TargetInfo:
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise BadInput(f"target {path}: no config.json (a local Hugging Face model directory expected)")
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure is the operator's file
        raise BadInput(f"{cfg_path}: transformers cannot read it ({type(exc).__name__}: {exc})") from exc
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("num_hidden_layers", "hidden_size"):
        if not isinstance(getattr(text, key, None), int):
            raise BadInput(f"{cfg_path}: no integer {key!r}")
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    archs = getattr(config, "architectures", None) or []
    weights = sum(p.stat().st_size for p in path.iterdir()
                  if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt"))
    return TargetInfo(path=path, architecture=archs[0] if archs else None,
                      model_type=getattr(config, "model_type", None),
                      num_layers=int(text.num_hidden_layers), hidden_size=int(text.hidden_size),
                      vocab_size=getattr(text, "vocab_size", None),
                      dtype=str(dtype).replace("torch.", "") if dtype is not None else None,
                      weight_bytes=weights)


def resolve_dtype(param: str | None, info: TargetInfo) -> str:
    name = str(param or "auto").lower().replace("torch.", "")
    if name == "auto":
        name = info.dtype or "float32"
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    name = aliases.get(name, name)
    if name not in ("bfloat16", "float16", "float32"):
        raise BadInput(f"dtype {param!r}: expected auto, bfloat16, float16 or float32")
    return name


@dataclass(frozen=True)
class Placement:
    device: str                  # where inputs go: "cpu", "cuda:N"
    device_map: str | None       # "auto" when spread over GPUs

    def describe(self) -> str:
        return "all GPUs (device_map=auto)" if self.device_map else self.device


def choose_placement(device: str, info: TargetInfo, world: int, local_rank: int) -> Placement:
    import torch

    device = str(device or "auto").lower()
    if device == "cpu":
        # Under torchrun on CPU each rank still takes its share (gloo does the barriers).
        return Placement("cpu", None)
    has_cuda = torch.cuda.is_available()
    if device not in ("auto", "cuda", "balanced") and not device.startswith("cuda:"):
        raise BadInput(f"device {device!r}: expected auto, cpu, cuda, cuda:N or balanced")
    if not has_cuda:
        if device == "auto":
            return Placement("cpu", None)
        raise BadInput(f"device {device!r}: CUDA is not available on this machine")
    if world > 1:
        if device == "balanced" or not _fits_one_gpu(info, local_rank):
            raise BadInput(f"the target ({info.weight_bytes / 2**30:.1f} GiB) does not fit one GPU: "
                           f"run one process (no torchrun) so device_map spreads it over all GPUs")
        return Placement(f"cuda:{local_rank}", None)
    if device.startswith("cuda:"):
        return Placement(device, None)
    if device == "balanced" or (torch.cuda.device_count() > 1 and not _fits_one_gpu(info, 0)):
        return Placement("cuda:0", "auto")
    return Placement("cuda:0", None)


def cap_memory(placement: Placement, fraction: float) -> None:
    """torch's per-process cap: allocations past it raise OutOfMemoryError
    (and so take the halving path) instead of crowding other processes."""
    import torch

    if not 0 < fraction <= 1:
        raise BadInput(f"memory_fraction {fraction}: expected a number in (0, 1]")
    if placement.device == "cpu":
        return
    devices = range(torch.cuda.device_count()) if placement.device_map else [torch.device(placement.device).index or 0]
    for index in devices:
        torch.cuda.set_per_process_memory_fraction(fraction, index)


def _fits_one_gpu(info: TargetInfo, index: int) -> bool:
    import torch

    total = torch.cuda.get_device_properties(index).total_memory
    return info.weight_bytes <= _FITS_ONE_GPU * total


def load_model(info: TargetInfo, dtype: str, placement: Placement):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    kwargs: dict = {}
    # transformers >= 4.56 names it `dtype`; older releases `torch_dtype`.
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    kwargs["dtype" if (major, minor) >= (4, 56) else "torch_dtype"] = getattr(torch, dtype)
    if placement.device_map:
        kwargs["device_map"] = placement.device_map
    model = AutoModelForCausalLM.from_pretrained(str(info.path), **kwargs)
    if not placement.device_map:
        model.to(placement.device)
    model.eval()
    return model
