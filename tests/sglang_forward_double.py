"""A test double of SGLang 0.5.23's prefill forward path, as the extraction engine
(ops/extract/sglang_capture.py SGLangTarget) drives it. SGLang's model runner
cannot run here (no GPU kernels; its model modules do not even import); this is
the boundary the engine's batch assembly and per-sample split are tested at.

Mirrored from the installed sglang 0.5.23 (python/sglang/srt/...):
- managers/schedule_batch.py `Req.__init__(rid, origin_input_text,
  origin_input_ids, sampling_params, ...)`; `Req.init_next_round_input(tree_cache)`
  sets the fill ids and, with the radix cache off (a ChunkCache matches no
  prefix), prefix 0 and extend length = the whole input.
- `ScheduleBatch.init_new(reqs, req_to_token_pool, token_to_kv_pool_allocator,
  tree_cache, model_config, enable_overlap, spec_algorithm)`;
  `prepare_for_extend()`: forward mode EXTEND, `extend_lens`, KV slots taken
  from the pools (alloc_for_extend), and the input ids of all requests back to
  back in batch order left in `prefill_input_ids_cpu`
  (flatten_arrays_to_pinned_cpu) with `input_ids = None`.
- managers/overlap_utils.py `resolve_forward_inputs(batch, future_map)`: for a
  prefill, `input_ids = prefill_input_ids_cpu.to(device)` and the staging
  cleared; the future map is not read.
- model_executor/forward_batch_info.py `ForwardBatch.init_new(batch,
  model_runner, *, capture_hidden_mode=None, return_hidden_states_before_norm)`
  (the latter keyword-only and required): extend_seq_lens = batch.extend_lens.
- model_executor/model_runner.py `ModelRunner.forward(forward_batch, ...)`
  returns `ModelRunnerOutput(logits_output, can_run_graph, ...)`.
- layers/logits_processor.py `LogitsProcessor.forward`: `next_token_logits`
  for the last token of each sequence (pruned, no input logprobs);
  `_get_hidden_states_to_store`: FULL -> the packed aux
  (pack_aux_hidden_states: [tokens, n_aux * H], layers in capture order), LAST
  -> the last token's rows only, NULL -> None, and the pre-norm state in place
  of either when return_hidden_states_before_norm;
  `_get_last_hidden_states_to_store`: the post-norm final state of every token
  under FULL with aux capture on (keep_last_hidden_states, i.e.
  features.aux_hidden_state_capture set), else None.
- models/llama.py `LlamaModel.forward`: layer i in `layers_to_capture` records
  its INPUT residual stream (layer_boundary/stage.py _prepare_attention), i.e.
  HF's hidden_states[i]; the final state is the final norm's output.
  `set_eagle3_layers_to_capture` is SGLang's own, compiled from the installed
  source (as tests/test_sglang_engine.py does).
- mem_cache: `ReqToTokenPool.size`, `BaseTokenToKVPoolAllocator.available_size()`;
  `ReqToTokenPool.clear()`, `BaseTokenToKVPoolAllocator.clear()` free every
  slot; an allocation beyond the pool's size fails.

What is modelled, not mirrored: the numbers. The model is a transformers
Llama run in batches padded as the HF engine pads them (ops/target_model/forward.py), so that
the same samples in the same batches give the HF engine's hidden states.
"""

from __future__ import annotations

import ast
import typing
from array import array
from enum import IntEnum
from types import SimpleNamespace

import torch

from ops.extract import sglang_engine
from ops.target_model.capture import base_model


class CaptureHiddenMode(IntEnum):
    NULL = 0
    LAST = 1
    FULL = 2


class SpeculativeAlgorithm(IntEnum):
    NONE = 1


class SamplingParams:
    def __init__(self, *, max_new_tokens: int = 128, temperature: float = 1.0) -> None:
        self.max_new_tokens, self.temperature = max_new_tokens, temperature


def sglang_methods(module: str, cls: str, names: tuple[str, ...]) -> dict:
    """Methods of an SGLang class compiled from the installed source, so the
    double runs SGLang's own code where it is plain Python (no kernels)."""
    path = sglang_engine._source_path(module)
    tree = ast.parse(path.read_text())
    ns = {"Optional": typing.Optional, "List": typing.List, "array": array, "list": list}
    out = {}
    for name in names:
        fn = sglang_engine._find(tree, [cls, name])
        assert fn is not None, f"{module}.{cls}.{name} not in {path}"
        fn.decorator_list = []
        exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), ns)
        out[name] = ns[name]
    return out


_REQ = sglang_methods("sglang.srt.managers.schedule_batch", "Req", ("refresh_fill_ids", "get_fill_ids"))


class Req:
    """Req's fill-id state as 0.5.23 keeps it: ids in array("q") (origin_input_ids
    as given, output_ids and full_untruncated_fill_ids created empty in
    __init__), extend_end None until admission sets it; refresh_fill_ids and
    get_fill_ids are SGLang's own, from the installed source, so ids of the
    wrong type fail here as they failed on the GPU (list + array)."""

    refresh_fill_ids = _REQ["refresh_fill_ids"]
    get_fill_ids = _REQ["get_fill_ids"]

    def __init__(self, rid, origin_input_text, origin_input_ids, sampling_params, **_) -> None:
        self.rid, self.origin_input_ids, self.sampling_params = rid, origin_input_ids, sampling_params
        self.output_ids = array("q")
        self.full_untruncated_fill_ids = array("q")
        self.extend_end = None
        self.prefix_len = 0
        self.initialized = False

    @property
    def extend_len(self) -> int:        # Req.extend_len
        return self.extend_end - self.prefix_len

    def init_next_round_input(self, tree_cache=None) -> None:
        self.refresh_fill_ids()
        self.prefix_len = 0             # radix cache off: a ChunkCache matches no prefix
        self.initialized = True


class Pool:
    """ReqToTokenPool / the KV allocator: `size` slots, freed by clear()."""

    def __init__(self, size: int) -> None:
        self.size, self.used, self.clears = size, 0, 0

    def alloc(self, n: int) -> None:
        if self.used + n > self.size:
            raise RuntimeError(f"Prefill out of memory: {n} slots asked, {self.size - self.used} free")
        self.used += n

    def available_size(self) -> int:
        return self.size - self.used

    def clear(self) -> None:
        self.used = 0
        self.clears += 1


class ScheduleBatch:
    @classmethod
    def init_new(cls, reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache, model_config,
                 enable_overlap, spec_algorithm, chunked_req=None, dllm_config=None):
        b = cls()
        b.reqs, b.req_to_token_pool, b.allocator = reqs, req_to_token_pool, token_to_kv_pool_allocator
        b.enable_overlap, b.spec_algorithm = enable_overlap, spec_algorithm
        b.input_ids = b.prefill_input_ids_cpu = None
        b.forward_mode = None
        return b

    def prepare_for_extend(self) -> None:
        # As 0.5.23's prepare_for_extend reads each req: fill ids from prefix_len,
        # seq_lens = extend_end, extend_lens = extend_len (None before admission: TypeError).
        assert all(r.initialized for r in self.reqs), "init_next_round_input not called"
        self.forward_mode = "EXTEND"
        input_ids = [r.get_fill_ids()[r.prefix_len:] for r in self.reqs]
        self.seq_lens = [r.extend_end for r in self.reqs]
        self.extend_lens = [r.extend_len for r in self.reqs]
        self.prefix_lens = [r.prefix_len for r in self.reqs]
        self.req_to_token_pool.alloc(len(self.reqs))
        self.allocator.alloc(sum(self.extend_lens))
        self.prefill_input_ids_cpu = torch.tensor([t for ids in input_ids for t in ids], dtype=torch.int64)
        self.input_ids = None


def resolve_forward_inputs(batch, future_map) -> None:
    if batch.prefill_input_ids_cpu is not None:
        batch.input_ids = batch.prefill_input_ids_cpu.to("cpu")
        batch.prefill_input_ids_cpu = None


class ForwardBatch:
    @classmethod
    def init_new(cls, batch, model_runner, *, capture_hidden_mode=None, return_hidden_states_before_norm):
        fb = cls()
        fb.forward_mode, fb.input_ids = batch.forward_mode, batch.input_ids
        fb.extend_seq_lens = list(batch.extend_lens)
        fb.capture_hidden_mode = CaptureHiddenMode.NULL if capture_hidden_mode is None else capture_hidden_mode
        fb.return_hidden_states_before_norm = return_hidden_states_before_norm
        return fb


class LogitsProcessorOutput(SimpleNamespace):
    pass


def sglang_setter(module: str, cls: str):
    """SGLang's own set_eagle3_layers_to_capture, from the installed source."""
    path = sglang_engine._source_path(module)
    fn = sglang_engine._find(ast.parse(path.read_text()), [cls, "set_eagle3_layers_to_capture"])
    ns = {"Optional": typing.Optional, "List": typing.List, "list": list}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), ns)
    return ns["set_eagle3_layers_to_capture"]


class TargetModel:
    """LlamaForCausalLM's capture state (capture_aux_hidden_states, model.layers_to_capture)."""

    set_eagle3_layers_to_capture = sglang_setter("sglang.srt.models.llama", "LlamaForCausalLM")

    def __init__(self, hf_model) -> None:
        self.hf = hf_model
        self.config = hf_model.config
        self.pp_group = SimpleNamespace(is_last_rank=True)
        self.model = SimpleNamespace(layers_to_capture=[])
        self.capture_aux_hidden_states = False


class ModelRunner:
    """forward(forward_batch) -> ModelRunnerOutput as 0.5.23 shapes it."""

    def __init__(self, hf_model, aux_capture_on: bool = True, oom_above_tokens: int | None = None) -> None:
        self.model = TargetModel(hf_model)
        self.aux_capture_on = aux_capture_on       # features.aux_hidden_state_capture set
        self.oom_above_tokens = oom_above_tokens
        self.forwards: list[list[int]] = []

    def init_attention_backends(self, layer_ids) -> None:
        # configure_aux_hidden_state_capture, with return_aux_hidden_state_layer_ids.
        self.model.set_eagle3_layers_to_capture(layer_ids)

    @torch.inference_mode()
    def forward(self, forward_batch, pp_proxy_tensors=None, reinit_attn_backend=False, split_forward_count=1):
        fb = forward_batch
        assert fb.forward_mode == "EXTEND" and fb.input_ids is not None, "ids not resolved to the device"
        lens = fb.extend_seq_lens
        self.forwards.append(list(lens))
        if self.oom_above_tokens is not None and len(lens) * max(lens) > self.oom_above_tokens:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (double)")
        longest = max(lens)
        ids = torch.zeros((len(lens), longest), dtype=torch.long)
        start = 0
        for row, n in enumerate(lens):
            ids[row, :n] = fb.input_ids[start:start + n]
            start += n
        mask = None
        if any(n < longest for n in lens):
            mask = torch.zeros((len(lens), longest), dtype=torch.long)
            for row, n in enumerate(lens):
                mask[row, :n] = 1
        out = base_model(self.model.hf)(input_ids=ids, attention_mask=mask, use_cache=False,
                                        output_hidden_states=True)
        hs = out.hidden_states                   # hs[i]: the input of layer i (0: embeddings)
        final = out.last_hidden_state            # post-norm
        capture = self.model.model.layers_to_capture if self.model.capture_aux_hidden_states else []

        def packed(t):
            return torch.cat([t[row, :n] for row, n in enumerate(lens)], dim=0)

        aux = torch.cat([packed(hs[i]) for i in capture], dim=-1) if capture else None
        # Stands for the pre-norm final state (transformers 5 overwrites its last
        # hidden_states entry with the post-norm one): a different tensor is enough
        # to tell which one the engine asked for.
        final_rows, pre_norm = packed(final), packed(hs[-2])
        last = torch.tensor([sum(lens[:i + 1]) - 1 for i in range(len(lens))])
        hidden = None
        if fb.capture_hidden_mode == CaptureHiddenMode.FULL:
            hidden = aux if aux is not None else final_rows
        elif fb.capture_hidden_mode == CaptureHiddenMode.LAST:
            hidden = (aux if aux is not None else final_rows)[last]
        if fb.return_hidden_states_before_norm and fb.capture_hidden_mode != CaptureHiddenMode.NULL:
            hidden = pre_norm if fb.capture_hidden_mode == CaptureHiddenMode.FULL else pre_norm[last]
        keep_last = self.aux_capture_on and aux is not None and fb.capture_hidden_mode == CaptureHiddenMode.FULL
        logits = self.model.hf.lm_head(final_rows[last])
        lpo = LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden,
                                    last_hidden_states=final_rows if keep_last else None)
        return SimpleNamespace(logits_output=lpo, can_run_graph=False)


def internals() -> SimpleNamespace:
    """What sglang_capture.internals() returns on the GPU host, doubled."""
    return SimpleNamespace(Req=Req, ScheduleBatch=ScheduleBatch, ForwardBatch=ForwardBatch,
                           CaptureHiddenMode=CaptureHiddenMode, SamplingParams=SamplingParams,
                           SpeculativeAlgorithm=SpeculativeAlgorithm,
                           resolve_forward_inputs=resolve_forward_inputs)


LOADS: list[dict] = []


def load(argv, *, tp_rank: int, gpu_id: int, expected_capture, n_aux: int, oom_above_tokens: int | None = None,
         req_slots: int = 64, kv_slots: int = 256):
    """sglang_capture.load, doubled: the argv through SGLang's real parser, the
    capture ids through SGLang's own set_eagle3_layers_to_capture (as
    init_attention_backends passes return_aux_hidden_state_layer_ids), the
    engine's own capture check; pools with room for a batch, not the run, so a batch whose
    slots were not freed makes the next one fail as SGLang's allocator would.
    Under torchrun a gloo group stands for SGLang's TP group."""
    import os

    import torch.distributed as dist

    from ops.extract import sglang_capture
    from ops.target_model import model as target_mod

    args = sglang_capture.server_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    info = target_mod.read_target(args.model_path)
    model = target_mod.load_model(info, args.dtype, target_mod.choose_placement("cpu", info, 1, 0))
    runner = ModelRunner(model, oom_above_tokens=oom_above_tokens)
    runner.init_attention_backends(args.return_aux_hidden_state_layer_ids)
    sglang_capture.check_capture(runner.model, expected_capture)
    # Room for one batch of the tests' budgets, not for all their tokens.
    pools = sglang_capture.Pools(Pool(req_slots), Pool(kv_slots), tree_cache=None)
    LOADS.append({"argv": list(argv), "tp_rank": tp_rank, "gpu_id": gpu_id, "runner": runner, "pools": pools})
    return sglang_capture.SGLangTarget(runner, pools, model_config=None, n_aux=n_aux, sg=internals())


def tp_cpu_group():
    import torch.distributed as dist

    return dist.group.WORLD
