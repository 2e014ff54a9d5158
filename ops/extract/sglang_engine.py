"""The SGLang extraction engine's contract with SGLang's internals: the pinned version and
every internal name and signature the engine would drive, checked before anything loads.

The engine (ops/extract/sglang_capture.py, the only module calling SGLang
internals; sglang_run.py, its glue with run.py's loop) calls exactly what
INTERNALS lists, so that an SGLang upgrade breaks tests/test_sglang_engine.py,
not a 2-hour run. It was written against the installed 0.5.23 source and has
never run against real SGLang (no GPU kernels where this project is built).

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
    # ops/extract/sglang_capture.py server_args(): SGLang's own parser and record.
    Internal("sglang.srt.server_args", "ServerArgs.add_cli_args", ("parser",), "the parser the engine's argv goes through"),
    Internal("sglang.srt.server_args", "ServerArgs.from_cli_args", ("args",),
             "the engine's ServerArgs (tp/ep, radix cache and chunked prefill off)"),
    Internal("sglang.srt.server_args", "PortArgs.init_new", ("server_args",), "the NCCL port with tp 1"),
    # load(): the scheduler process's bring-up (managers/scheduler.py run_scheduler_process, Scheduler.__init__).
    Internal("sglang.srt.environ", "Envs.SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE", (),
             "env:// under torchrun: the TP group joins torchrun's store"),
    Internal("sglang.srt.runtime_context", "publish", ("server_args", "role", "ranks"),
             "installs the resolved config and this rank's placement"),
    Internal("sglang.srt.runtime_context", "SpawnRanks.world_rank", (), "this rank's place in the TP group"),
    Internal("sglang.srt.runtime_context", "SpawnRanks.gpu_id", (), "this rank's GPU (LOCAL_RANK)"),
    Internal("sglang.srt.runtime_context", "get_device", (), "the device kind init_parallel_runtime takes"),
    Internal("sglang.srt.configs.model_config", "ModelConfig.from_server_args", ("server_args",),
             "the target's config as SGLang resolves it"),
    Internal("sglang.srt.distributed.bootstrap", "init_parallel_runtime", ("server_args", "device", "dist_port"),
             "the process groups (TP, EP) of this rank"),
    Internal("sglang.srt.distributed.bootstrap", "init_layer_runtime", ("model_config",), "per-model layer state"),
    Internal("sglang.srt.layers.moe.utils", "initialize_moe_config", (), "MoE runner config (MoE targets)"),
    Internal("sglang.srt.layers.quantization.fp8_utils", "initialize_fp8_gemm_config", (), "GEMM backends"),
    Internal("sglang.srt.layers.quantization.fp4_utils", "initialize_fp4_gemm_config", (), "GEMM backends"),
    Internal("sglang.srt.layers.quantization.unquant", "initialize_bf16_gemm_config", (), "GEMM backends"),
    Internal("sglang.srt.managers.tp_worker", "TpModelWorker.__init__", ("server_args", "gpu_id", "nccl_port"),
             "loads the target shard of this rank (tp/ep) through ModelRunner"),
    Internal("sglang.srt.managers.tp_worker", "BaseTpWorker.model_runner", (), "the worker's ModelRunner"),
    Internal("sglang.srt.runtime_context", "get_model", (), "the published model namespace"),
    Internal("sglang.srt.arg_groups.fields.model", "Model.is_startup_weight_load_overlap", (),
             "weights loaded beside startup: then started and finalized as the scheduler does"),
    Internal("sglang.srt.managers.tp_worker", "TpModelWorker.start_startup_weight_load", (), "overlap load"),
    Internal("sglang.srt.managers.tp_worker", "TpModelWorker.finalize_startup_weight_load", (), "overlap load"),
    Internal("sglang.srt.managers.tp_worker", "TpModelWorker.init_cuda_graphs", (),
             "no graphs (both backends disabled): sets the runner's eager runner"),
    Internal("sglang.srt.model_executor.model_runner", "ModelRunner.init_cuda_graphs", (), "sets eager_runner"),
    Internal("sglang.srt.managers.tp_worker", "BaseTpWorker.preloaded_weights_bytes", (), "for the KV sizing"),
    Internal("sglang.srt.managers.tp_worker", "TpModelWorker.alloc_memory_pool", (), "the KV pools"),
    Internal("sglang.srt.managers.tp_worker", "TpModelWorker.init_attention_backends", (),
             "attention backends; calls set_eagle3_layers_to_capture (configure_aux_hidden_state_capture)"),
    Internal("sglang.srt.model_executor.model_runner_components.attention_backend_setup",
             "configure_aux_hidden_state_capture", ("model", "eagle_use_aux_hidden_state",
                                                    "eagle_aux_hidden_state_layer_ids"),
             "where the capture-only mode's layer ids reach the model"),
    Internal("sglang.srt.model_executor.model_runner", "ModelRunner.__init__",
             ("model_config", "mem_fraction_static", "gpu_id", "nccl_port", "server_args"),
             "built by TpModelWorker"),
    Internal("sglang.srt.model_executor.model_runner", "ModelRunner.account_preloaded_weights",
             ("preloaded_weights_bytes",), "as the scheduler does before alloc_memory_pool"),
    Internal("sglang.srt.model_executor.model_runner", "ModelRunner.forward", ("forward_batch",),
             "the prefill forward that fills the aux hidden states"),
    Internal("sglang.srt.model_executor.model_runner", "ModelRunnerOutput.logits_output", (),
             "forward's LogitsProcessorOutput"),
    Internal("sglang.srt.mem_cache.kv_cache_builder", "build_kv_cache",
             ("server_args", "model_config", "tp_worker", "page_size", "spec_algorithm", "enable_metrics",
              "enable_kv_cache_events", "enable_hierarchical_cache"),
             "the pools and the (chunk) tree cache a ScheduleBatch needs"),
    Internal("sglang.srt.mem_cache.kv_cache_builder", "KVCacheBuildResult.tree_cache", (), "build_kv_cache's"),
    Internal("sglang.srt.mem_cache.kv_cache_builder", "KVCacheBuildResult.req_to_token_pool", (), "build_kv_cache's"),
    Internal("sglang.srt.mem_cache.kv_cache_builder", "KVCacheBuildResult.token_to_kv_pool_allocator", (),
             "build_kv_cache's"),
    Internal("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.clear", (), "frees a batch's request slots"),
    Internal("sglang.srt.mem_cache.allocator.base", "BaseTokenToKVPoolAllocator.clear", (),
             "frees a batch's KV slots"),
    Internal("sglang.srt.mem_cache.allocator.base", "BaseTokenToKVPoolAllocator.available_size", (),
             "the tokens one extend may take"),
    Internal("sglang.srt.distributed.parallel_state", "get_tp_group", (),
             "its cpu_group carries each batch from rank 0 to the others"),
    # SGLangTarget.forward(): one EXTEND batch of the samples, every token's state.
    Internal("sglang.srt.sampling.sampling_params", "SamplingParams.max_new_tokens", (), "1: prefill only"),
    Internal("sglang.srt.sampling.sampling_params", "SamplingParams.temperature", (), "0: no sampling noise"),
    Internal("sglang.srt.managers.schedule_batch", "Req.__init__", ("rid", "origin_input_text", "origin_input_ids",
                                                                    "sampling_params"),
             "one sample as a request"),
    Internal("sglang.srt.managers.schedule_batch", "Req.init_next_round_input", ("tree_cache",),
             "fill ids and extend length before a prefill"),
    Internal("sglang.srt.managers.schedule_batch", "ScheduleBatch.init_new",
             ("reqs", "req_to_token_pool", "token_to_kv_pool_allocator", "tree_cache", "model_config",
              "enable_overlap", "spec_algorithm"),
             "a prefill batch of samples"),
    Internal("sglang.srt.managers.schedule_batch", "ScheduleBatch.prepare_for_extend", (),
             "EXTEND mode, KV slots, the packed input ids"),
    Internal("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm.NONE", (), "no draft in the batch"),
    Internal("sglang.srt.managers.schedule_batch", "ScheduleBatch.prefill_input_ids_cpu", (),
             "where prepare_for_extend leaves the ids"),
    Internal("sglang.srt.managers.overlap_utils", "resolve_forward_inputs", ("batch", "future_map"),
             "copies them to the device, as run_batch does before the forward"),
    Internal("sglang.srt.utils.common", "require_mlp_sync", (), "refused when true (attention DP, MoE a2a)"),
    Internal("sglang.srt.model_executor.forward_batch_info", "CaptureHiddenMode.FULL", (),
             "capture every token's state, not the last one's"),
    Internal("sglang.srt.model_executor.forward_batch_info", "ForwardBatch.init_new",
             ("batch", "model_runner", "capture_hidden_mode", "return_hidden_states_before_norm"),
             "the ForwardBatch of a ScheduleBatch, capture mode FULL, post-norm final"),
    Internal("sglang.srt.layers.logits_processor", "LogitsProcessorOutput.hidden_states", (),
             "FULL + aux capture: the packed aux [tokens, n_aux * H]"),
    Internal("sglang.srt.layers.logits_processor", "LogitsProcessorOutput.last_hidden_states", (),
             "FULL + aux capture: the post-norm final state of every token"),
    Internal("sglang.srt.layers.logits_processor", "LogitsProcessor._get_last_hidden_states_to_store", (),
             "keeps last_hidden_states when aux capture is on"),
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


_MISSING = object()
_FIELD = object()   # a dataclass field without a class-level default: exists only on instances


def _member(obj, name: str):
    """`obj.name` as the static check reads the source: a class attribute whose
    value is None (`prefill_input_ids_cpu: Optional[Tensor] = None`) is there, and
    so is a dataclass field that has no default (`logits_output: ...` in
    ModelRunnerOutput; slots=True dataclasses keep no class value either), which
    getattr on the class cannot see."""
    try:
        return getattr(obj, name)
    except AttributeError:
        pass
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if name in getattr(klass, "__dataclass_fields__", {}) or name in vars(klass).get("__annotations__", {}):
                return _FIELD
    return _MISSING


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
            obj = _member(obj, part)
            if obj is _MISSING:
                break
        if obj is _MISSING:
            problems.append(f"{it.module}.{it.qualname}: not found ({it.why})")
            continue
        if it.params and obj is not _FIELD and callable(obj):
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
