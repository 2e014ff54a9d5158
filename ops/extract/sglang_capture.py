"""The SGLang engine's adapter: the only module that calls SGLang internals.

Sits where ops/target_model/forward.py sits for the Hugging Face engine: between the batch plan
and the writers (the glue is sglang_run.py). Per rank it brings a target up the
way 0.5.23's own scheduler process does (managers/scheduler.py
run_scheduler_process -> Scheduler.__init__ -> init_model_worker, minus the
ZMQ/tokenizer/scheduling parts), and runs one prefill (EXTEND) forward per
token-budget batch:

- ServerArgs from an argv parsed by SGLang's own parser (server_argv): tp/ep,
  radix cache off and chunked prefill off (so each sample is one extend of all
  its tokens from position 0: every token's state, no prefix reuse), both CUDA
  graph backends off (one eager prefill of any shape), no tokenizer, no overlap
  scheduler. Aux capture through SGLang's capture-only mode
  (`--enable-return-aux-hidden-states --speculative-algorithm EAGLE3
  --return-aux-hidden-state-layer-ids IDS`, arg_groups/validation_hook.py
  handle_aux_hidden_state_capture: no draft loaded, speculative stack off).
  ModelRunner.init_attention_backends then calls the target's own
  `set_eagle3_layers_to_capture(IDS)` (model_runner_components/
  attention_backend_setup.py configure_aux_hidden_state_capture); IDS are
  ops/layers.py's `sglang_config_layer_ids`, which under that model's rule
  (llama: +1; deepseek_v2: +1 only when the first id is 1) land on the
  canonical k + 1; `load` checks `layers_to_capture` afterwards.
- The LM head is not skipped: its logits are computed for the last token of
  each sample only (logits_processor.py `_get_pruned_states` prunes to the last
  position when no input logprobs are asked) and discarded. That is
  samples x vocab x H per batch against tokens x layers x params for the
  forward, and skipping it would mean patching LogitsProcessor, whose output is
  where 0.5.23 hands the captured states out: with CaptureHiddenMode.FULL and
  aux capture on, `LogitsProcessorOutput.hidden_states` is the packed aux
  [tokens, n_aux * H] (pack_aux_hidden_states) and `last_hidden_states` the
  post-norm final state of every token (`_get_last_hidden_states_to_store`,
  kept because `features.aux_hidden_state_capture` is set).
  `return_hidden_states_before_norm=False`: with it, `_get_hidden_states_to_store`
  would return the pre-norm state in place of the aux.
- TP ranks: a capture is the residual stream at the next layer's input, taken
  after `stream.complete(...)` finishes the pending row-parallel all-reduce
  (layers/layer_boundary/stage.py `_prepare_attention`: "Aux consumers need a
  materialized output before the input norm"), and the final state is the
  final norm of that stream; so with plain TP every rank holds the same full
  [tokens, H] states and rank 0 writes. Attention DP and LayerNorm SP stay
  off (attn_dp_size 1, enable_layernorm_sp False: there a rank holds only its
  share of the tokens, `capture_move` / `maybe_exit_gather`), and `load`
  refuses a setup that needs the MLP sync (utils/common.py require_mlp_sync).

Every SGLang name called here is in sglang_engine.INTERNALS (checked against
the installed source by tests/test_sglang_engine.py).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace


def server_argv(*, target: str, tp: int, ep: int, dtype: str, context_length: int,
                config_layer_ids: Sequence[int], mem_fraction_static: float | None = None,
                seed: int = 0, extra_args: Sequence[str] = ()) -> list[str]:
    """The `python -m sglang.launch_server`-style argv of the engine's ServerArgs."""
    argv = ["--model-path", str(target), "--tp-size", str(tp), "--ep-size", str(ep),
            "--dtype", dtype, "--context-length", str(context_length),
            "--disable-radix-cache", "--chunked-prefill-size", "-1",
            "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
            "--skip-tokenizer-init", "--disable-overlap-schedule",
            "--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
            "--return-aux-hidden-state-layer-ids", *[str(int(i)) for i in config_layer_ids],
            "--random-seed", str(seed)]
    if mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(mem_fraction_static)]
    # The operator's flags last (attention backend, memory, cluster): the
    # managed ones are refused before (sglang_args.MANAGED), so none overrides ours.
    return argv + list(extra_args)


def server_args(argv: Sequence[str]):
    """SGLang's ServerArgs for `argv`, through its own parser (unresolved:
    resolve_once, which reads the checkpoint and the GPUs, runs in publish)."""
    from ops.extract.sglang_args import parse_full

    return parse_full(argv)


def internals() -> SimpleNamespace:
    """The SGLang callables the forward path uses, imported on the GPU host."""
    from sglang.srt.managers.overlap_utils import resolve_forward_inputs
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SimpleNamespace(Req=Req, ScheduleBatch=ScheduleBatch, ForwardBatch=ForwardBatch,
                           CaptureHiddenMode=CaptureHiddenMode, SamplingParams=SamplingParams,
                           SpeculativeAlgorithm=SpeculativeAlgorithm,
                           resolve_forward_inputs=resolve_forward_inputs)


@dataclass
class Pools:
    req_to_token_pool: object
    token_to_kv_pool_allocator: object
    tree_cache: object


def split_states(logits_output, lengths: Sequence[int], n_aux: int):
    """(aux [T, n_aux*H], final [T, H]) of one extend forward, checked against
    the batch: the rows are the samples' tokens back to back in batch order
    (ForwardBatch's extend layout: extend_seq_lens, no prefix)."""
    aux, final = logits_output.hidden_states, logits_output.last_hidden_states
    total = sum(lengths)
    if aux is None or final is None:
        raise RuntimeError("SGLang returned no hidden states: is aux capture on "
                           "(--enable-return-aux-hidden-states) and the capture mode FULL?")
    if final.shape[0] != total or aux.shape[0] != total:
        raise RuntimeError(f"SGLang returned {aux.shape[0]} aux / {final.shape[0]} final rows "
                           f"for {total} tokens: not every token's state (radix cache or chunked prefill on?)")
    if aux.shape[-1] != n_aux * final.shape[-1]:
        raise RuntimeError(f"SGLang captured {aux.shape[-1] / final.shape[-1]:g} aux layers, {n_aux} asked")
    return aux, final


class SGLangTarget:
    """One rank's target in SGLang; `forward(token_lists)` returns the packed
    (aux [T, n_aux*H], final [T, H]) of the batch, rows in batch order."""

    def __init__(self, runner, pools: Pools, model_config, n_aux: int, sg: SimpleNamespace | None = None) -> None:
        self.runner, self.pools, self.model_config, self.n_aux = runner, pools, model_config, n_aux
        self.sg = sg if sg is not None else internals()
        # What one extend may hold: the request pool bounds the samples, the KV
        # pool the tokens. Every TP rank must cut a batch alike (its extends are
        # collectives), so sglang_run takes the minimum over the ranks.
        self.max_reqs = max(1, int(pools.req_to_token_pool.size) - 1)   # slot 0 may be reserved
        self.max_tokens = int(pools.token_to_kv_pool_allocator.available_size())

    def forward(self, token_lists: Sequence[Sequence[int]]):
        """The batch, in as few extends as the pools hold."""
        import torch

        max_reqs, max_tokens = self.max_reqs, self.max_tokens
        groups, current, tokens = [], [], 0
        for t in token_lists:
            if len(t) > max_tokens:
                raise torch.cuda.OutOfMemoryError(f"a sample of {len(t)} tokens exceeds SGLang's KV pool "
                                                  f"({max_tokens} tokens; raise mem_fraction_static)")
            if current and (len(current) == max_reqs or tokens + len(t) > max_tokens):
                groups.append(current)
                current, tokens = [], 0
            current.append(t)
            tokens += len(t)
        if current:
            groups.append(current)
        pieces = [self._extend(g) for g in groups]
        if len(pieces) == 1:
            return pieces[0]
        return torch.cat([a for a, _ in pieces]), torch.cat([f for _, f in pieces])

    def _extend(self, token_lists: Sequence[Sequence[int]]):
        sg = self.sg
        params = sg.SamplingParams(max_new_tokens=1, temperature=0.0)
        reqs = []
        for i, tokens in enumerate(token_lists):
            # 0.5.23's Req holds token ids as array("q") (schedule_batch.py
            # Req.__init__ `origin_input_ids: array[int]`; refresh_fill_ids adds
            # them to its array("q") output_ids, which a list cannot take).
            req = sg.Req(rid=f"extract-{i}", origin_input_text="", origin_input_ids=array("q", map(int, tokens)),
                         sampling_params=params)
            # fill ids and the prefix match, as the scheduler does before a
            # prefill; with the radix cache off nothing matches: prefix 0.
            req.init_next_round_input(self.pools.tree_cache)
            # Admission: the whole sequence in this extend, as PrefillAdder does
            # with chunked prefill off (schedule_policy.py add_one_req:
            # `req.extend_end = len(req.full_untruncated_fill_ids)`); prepare_for_extend
            # reads seq_lens and extend_len from it.
            req.extend_end = len(req.full_untruncated_fill_ids)
            reqs.append(req)
        batch = sg.ScheduleBatch.init_new(
            reqs=reqs, req_to_token_pool=self.pools.req_to_token_pool,
            token_to_kv_pool_allocator=self.pools.token_to_kv_pool_allocator,
            tree_cache=self.pools.tree_cache, model_config=self.model_config,
            enable_overlap=False, spec_algorithm=sg.SpeculativeAlgorithm.NONE)
        try:
            batch.prepare_for_extend()
            # prepare_for_extend leaves the ids in pinned host staging; the
            # scheduler's non-overlap path copies them up just before the
            # forward (scheduler.py run_batch). No future map: a prefill of
            # new requests reads none (overlap_utils.py).
            sg.resolve_forward_inputs(batch, None)
            fb = sg.ForwardBatch.init_new(batch, self.runner, capture_hidden_mode=sg.CaptureHiddenMode.FULL,
                                          return_hidden_states_before_norm=False)
            out = self.runner.forward(forward_batch=fb)
            return split_states(out.logits_output, [len(t) for t in token_lists], self.n_aux)
        finally:
            # One forward, no decode after it: the KV slots it took are free
            # again for the next batch (the states returned are not KV).
            self.pools.req_to_token_pool.clear()
            self.pools.token_to_kv_pool_allocator.clear()

    def close(self) -> None:
        pass


def load(argv: Sequence[str], *, tp_rank: int, gpu_id: int, expected_capture: Sequence[int],
         n_aux: int) -> SGLangTarget:
    """Bring the target up on this rank (collective over the TP group): the
    sequence of 0.5.23's scheduler process without its IPC and scheduling."""
    from ops.common import BadInput
    from ops.extract.sglang_engine import PINNED_SGLANG

    dtype = argv[list(argv).index("--dtype") + 1] if "--dtype" in argv else None
    if dtype == "float32":
        # Seen on the H200: sgl_kernel's rmsnorm "failed to dispatch data type Float"
        # at the first forward, after the whole load.
        raise BadInput(f"engine sglang: dtype float32: SGLang {PINNED_SGLANG}'s fused kernels (sgl_kernel "
                       f"rmsnorm) take bfloat16 or float16; set the stage's dtype = \"bfloat16\"")
    try:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed.bootstrap import init_layer_runtime, init_parallel_runtime
        from sglang.srt.layers.moe.utils import initialize_moe_config
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
        from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config
        from sglang.srt.managers.tp_worker import TpModelWorker
        from sglang.srt.mem_cache.kv_cache_builder import build_kv_cache
        from sglang.srt.runtime_context import SpawnRanks, get_device, get_model, publish
        from sglang.srt.server_args import PortArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.utils.common import require_mlp_sync
    except ImportError as exc:
        # The version check passed on the package metadata; an install without its
        # dependencies (pip --no-deps, as bin/test does) has no model runner.
        raise BadInput(f"engine sglang: sglang {PINNED_SGLANG} is installed, but its runtime does not import "
                       f"here ({exc}); install it with its dependencies on a GPU host "
                       f"(pip install sglang=={PINNED_SGLANG})") from None

    args = server_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Under torchrun the TP group is torchrun's world: env:// joins the
        # agent's store (MASTER_ADDR/MASTER_PORT), no port of our own to agree on.
        os.environ.setdefault("SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE", "env://")
        nccl_port = int(os.environ.get("MASTER_PORT", "0"))
    else:
        nccl_port = PortArgs.init_new(args).nccl_port
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=tp_rank, gpu_id=gpu_id))
    model_config = ModelConfig.from_server_args(args)
    init_parallel_runtime(server_args=args, device=get_device().device, dist_port=nccl_port)
    init_layer_runtime(model_config=model_config)
    text = model_config.hf_text_config
    if any(hasattr(text, a) for a in ("num_experts_per_tok", "num_experts_per_token", "top_k_experts",
                                       "moe_top_k", "moe_topk")):
        initialize_moe_config()
    initialize_fp8_gemm_config()
    initialize_fp4_gemm_config()
    initialize_bf16_gemm_config()
    if require_mlp_sync():
        raise RuntimeError("engine sglang: this setup needs SGLang's MLP sync (attention DP or an MoE "
                           "all-to-all backend), which the engine's plain prefill batch does not do")
    worker = TpModelWorker(server_args=args, gpu_id=gpu_id, nccl_port=nccl_port)
    overlap_load = get_model().is_startup_weight_load_overlap
    if overlap_load:
        worker.start_startup_weight_load()
    runner = worker.model_runner
    runner.account_preloaded_weights(preloaded_weights_bytes=worker.preloaded_weights_bytes)
    worker.alloc_memory_pool()
    worker.init_attention_backends()       # calls set_eagle3_layers_to_capture
    # Both graph backends are off, so this captures nothing; it is where the
    # runner gets the eager runner its forward() dispatches an extend to.
    worker.init_cuda_graphs()
    if overlap_load:
        worker.finalize_startup_weight_load()
    check_capture(runner.model, expected_capture)
    kv = build_kv_cache(
        server_args=args, model_config=model_config, tp_worker=worker, page_size=runner.page_size,
        spec_algorithm=SpeculativeAlgorithm.NONE, enable_metrics=False, enable_kv_cache_events=False,
        enable_hierarchical_cache=False)
    pools = Pools(kv.req_to_token_pool, kv.token_to_kv_pool_allocator, kv.tree_cache)
    return SGLangTarget(runner, pools, model_config, n_aux)


def check_capture(model, expected: Sequence[int]) -> None:
    """The layers the target's set_eagle3_layers_to_capture chose are the canonical k + 1."""
    captured = list(getattr(getattr(model, "model", None), "layers_to_capture", None) or [])
    if not getattr(model, "capture_aux_hidden_states", False) or captured != list(expected):
        raise RuntimeError(f"SGLang captures layers {captured}, expected {list(expected)} "
                           f"(ops/layers.py's rule for this architecture no longer SGLang's?)")


def tp_cpu_group():
    """The TP group's gloo group: rank 0 hands each batch to the others on it."""
    from sglang.srt.distributed.parallel_state import get_tp_group

    return get_tp_group().cpu_group
