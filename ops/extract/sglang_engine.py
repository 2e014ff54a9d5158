"""The SGLang extraction engine's contract with SGLang's internals: the pinned version and
every internal name and signature the engine would drive, checked before anything loads.

What exists: this check. What does not (yet): the capture path itself (the
target loaded by SGLang's ModelRunner with tp/ep, the aux layers captured
through `set_eagle3_layers_to_capture` and CaptureHiddenMode.FULL, radix cache
and chunked prefill off, batches filled to a token budget, written in
DESIGN.md's format). It was not built: it cannot be run or tested where this
project is built (no GPU kernels), and `extract` has no `engine = "sglang"`
param until it is. What it will call is listed in INTERNALS, so that an SGLang
upgrade breaks tests/test_sglang_engine.py, not a 2-hour run.

Two ways to check INTERNALS:
- static (anywhere, here and in CI): the installed package's source files are
  parsed (ast) and each class / function / parameter looked up. Importing those
  modules needs SGLang's GPU-side dependencies (torchvision, tvm_ffi, the
  kernel packages), which a CPU machine does not have;
- runtime (on the GPU host, before a run): the modules are imported and
  `inspect.signature` is read.

`python -m ops.extract.sglang_engine` prints both verdicts; exit 0 when the
installed SGLang is the pinned one and every internal is there, 2 otherwise.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

PINNED_SGLANG = "0.5.23"


@dataclass(frozen=True)
class Internal:
    module: str             # e.g. sglang.srt.models.llama
    qualname: str           # Class, Class.method or function
    params: tuple[str, ...] = ()   # parameter names the engine passes
    why: str = ""


INTERNALS: tuple[Internal, ...] = (
    Internal("sglang.srt.server_args", "ServerArgs.from_cli_args", ("args",),
             "the engine's ServerArgs (tp/ep, radix cache and chunked prefill off)"),
    Internal("sglang.srt.server_args", "PortArgs.init_new", ("server_args",), "the NCCL port of each rank"),
    Internal("sglang.srt.configs.model_config", "ModelConfig.from_server_args", ("server_args",),
             "the target's config as SGLang resolves it"),
    Internal("sglang.srt.model_executor.model_runner", "ModelRunner.__init__",
             ("model_config", "mem_fraction_static", "gpu_id", "nccl_port", "server_args"),
             "loads the target shard of this rank (tp/ep)"),
    Internal("sglang.srt.model_executor.model_runner", "ModelRunner.forward", ("forward_batch",),
             "the prefill forward that fills the aux hidden states"),
    Internal("sglang.srt.model_executor.forward_batch_info", "CaptureHiddenMode.FULL", (),
             "capture every token's state, not the last one's"),
    Internal("sglang.srt.model_executor.forward_batch_info", "ForwardBatch.init_new", ("batch", "model_runner"),
             "a ForwardBatch from a ScheduleBatch's worker batch"),
    Internal("sglang.srt.managers.schedule_batch", "ScheduleBatch.init_new", (), "a prefill batch of samples"),
    Internal("sglang.srt.managers.schedule_batch", "Req.__init__", ("rid", "origin_input_text", "origin_input_ids",
                                                                    "sampling_params"),
             "one sample as a request"),
    Internal("sglang.srt.models.llama", "LlamaForCausalLM.set_eagle3_layers_to_capture", ("layer_ids",),
             "llama.py's rule: layers_to_capture = ids + 1 (ops/layers.py)"),
    Internal("sglang.srt.models.deepseek_v2", "DeepseekV2ForCausalLM.set_eagle3_layers_to_capture", ("layer_ids",),
             "deepseek_v2.py's rule (DeepSeek V2/V3, Kimi K2): +1 only when the first id is 1"),
)


class EngineVersionError(RuntimeError):
    pass


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_version(version: str | None = None) -> str:
    """The installed SGLang's version, or EngineVersionError saying what to do."""
    version = installed_version() if version is None else version
    if version is None:
        raise EngineVersionError(f"engine sglang: sglang is not installed; pip install sglang=={PINNED_SGLANG}")
    if version != PINNED_SGLANG:
        raise EngineVersionError(
            f"engine sglang: sglang {version} is installed, but this engine drives SGLang internals checked "
            f"against {PINNED_SGLANG} only (model runner, capture mode, set_eagle3_layers_to_capture); "
            f"pip install sglang=={PINNED_SGLANG}, or re-check INTERNALS in ops/extract/sglang_engine.py "
            f"against {version} and move the pin")
    return version


def _source_path(module: str) -> Path | None:
    top = importlib.util.find_spec(module.split(".")[0])
    if top is None or not top.submodule_search_locations:
        return None
    base = Path(list(top.submodule_search_locations)[0])
    rel = Path(*module.split(".")[1:])
    for cand in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
        if cand.exists():
            return cand
    return None


def _find(tree: ast.AST, parts: list[str]) -> ast.AST | None:
    nodes = getattr(tree, "body", [])
    node = None
    for part in parts:
        node = next((n for n in nodes if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            # An enum member or class attribute: `FULL = 2`.
            for n in nodes:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    return n
            return None
        nodes = getattr(node, "body", [])
    return node


def _arg_names(fn: ast.AST) -> set[str]:
    a = fn.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}


def check_static(internals=INTERNALS) -> list[str]:
    """What is missing from the installed source, one line each (empty: all there)."""
    problems = []
    trees: dict[str, ast.AST] = {}
    for it in internals:
        path = _source_path(it.module)
        if path is None:
            problems.append(f"{it.module}: no such module in the installed sglang ({it.why})")
            continue
        if it.module not in trees:
            trees[it.module] = ast.parse(path.read_text(), str(path))
        node = _find(trees[it.module], it.qualname.split("."))
        if node is None:
            problems.append(f"{it.module}.{it.qualname}: not found in {path} ({it.why})")
            continue
        if it.params and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            missing = [p for p in it.params if p not in _arg_names(node)]
            if missing:
                problems.append(f"{it.module}.{it.qualname}: no parameter(s) {missing} ({it.why})")
    return problems


def check_runtime(internals=INTERNALS) -> list[str]:
    """The same by importing (on the GPU host, where SGLang's dependencies are installed)."""
    problems = []
    for it in internals:
        try:
            obj = importlib.import_module(it.module)
        except Exception as exc:  # noqa: BLE001 - any import failure is the finding
            problems.append(f"{it.module}: cannot import ({type(exc).__name__}: {exc})")
            continue
        for part in it.qualname.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is None:
            problems.append(f"{it.module}.{it.qualname}: not found ({it.why})")
            continue
        if it.params and callable(obj):
            names = set(inspect.signature(obj).parameters)
            missing = [p for p in it.params if p not in names]
            if missing:
                problems.append(f"{it.module}.{it.qualname}: no parameter(s) {missing} ({it.why})")
    return problems


def main(argv=None) -> int:
    try:
        version = check_version()
    except EngineVersionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"sglang {version}: the pinned version")
    static = check_static()
    print(f"static check of {len(INTERNALS)} internals: " + ("all present" if not static else "MISSING"))
    for line in static:
        print(f"  {line}")
    runtime = check_runtime() if "--runtime" in (argv if argv is not None else sys.argv[1:]) else None
    if runtime is not None:
        print("runtime check: " + ("all importable and present" if not runtime else "PROBLEMS"))
        for line in runtime:
            print(f"  {line}")
    return 0 if not static and not runtime else 2


if __name__ == "__main__":
    sys.exit(main())
