"""The argv of `python -m sglang.launch_server` for a serve stage, and the lints run before launch.

Importable without torch or sglang: the console builds the plan from here.
Everything SGLang-specific was read from sglang 0.5.23's installed source
(PINNED_SGLANG); tests/test_op_serve.py checks these tables and every argv
built here against that version's own parser (ServerArgs.add_cli_args +
ServerArgs.from_cli_args), so an upgrade that renames a flag breaks a test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ops import layers
from ops.common import read_json
from ops.sglang_flags import extra_args_of, flags
from ops.spec import Lint

PINNED_SGLANG = "0.5.23"
SGLANG_LAUNCHER = "sglang.launch_server"

# Flags the pinned version still accepts but warns about, with what replaces
# them: python/sglang/srt/server_args.py, ServerArgs.add_cli_args, "Deprecated
# argument registrations" (DeprecatedStoreTrueAction / DeprecatedStoreConstAction
# in python/sglang/srt/arg_groups/argparse_actions.py).
DEPRECATED_FLAGS = {
    "--disable-cuda-graph": "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled",
    "--enable-dp-attention": "--attn-dp-size <dp-size> in place of --dp-size <dp-size> with it",
    "--monokernel-backend": "--enable-amd-monokernel",
    "--enable-flashinfer-allreduce-fusion": "--flashinfer-allreduce-fusion-backend auto",
}
# Flags of earlier SGLang releases that the pinned parser no longer knows
# (it would stop with "unrecognized arguments"); the test checks that they
# are absent from its parser and that each replacement is present.
REMOVED_FLAGS = {
    "--enable-ep-moe": "--ep-size <n> (the ep param)",
    "--enable-deepep-moe": "--moe-a2a-backend deepep",
}
# Flags this op sets from its own params: in extra_args they would fight them.
# With every alias the pinned parser gives the same field (argparse keeps the last
# value, so `--tensor-parallel-size 4` after `--tp-size 8` would win silently).
MANAGED = {
    "--model-path": "model_path", "--model": "model_path",
    "--tp-size": "tp", "--tensor-parallel-size": "tp",
    "--dp-size": "dp", "--data-parallel-size": "dp",
    "--ep-size": "ep", "--expert-parallel-size": "ep", "--ep": "ep",
    "--port": "port", "--host": "host", "--mem-fraction-static": "mem_fraction_static",
    "--context-length": "context_length", "--speculative-algorithm": "speculative_algorithm",
    "--speculative-draft-model-path": "drafter", "--speculative-draft-model": "drafter",
    "--speculative-num-steps": "num_steps",
    "--speculative-eagle-topk": "topk", "--speculative-num-draft-tokens": "num_draft_tokens",
    "--enable-metrics": "enable_metrics",
}
# A speculative server's verify cycle (drafts + one target verify forward) at batch 1 is
# what bench's speed-up divides by; in sglang 0.5.23 these settings shorten it:
# - CUDA graphs of the decode phase: EAGLEWorkerV2._capture_cuda_graphs
#   (python/sglang/srt/speculative/eagle_worker_v2.py:476-519) captures the drafter's
#   multi-step draft (EAGLEDraftCudaGraphRunner) and its draft extend only when
#   cuda_graph_config.decode.backend is not "disabled" (line 481), and the target's verify
#   replays the decode graph runner (model_executor/runner/decode_cuda_graph_runner.py,
#   TARGET_VERIFY). "full" is 0.5.23's default (model_executor/cuda_graph_config.py:
#   CudaGraphConfig.decode = PhaseConfig(backend=Backend.FULL)); the op says it explicitly,
#   so that a default that changes, or the legacy --disable-cuda-graph, cannot drop the
#   graphs unseen. An operator's own decode-graph flag in extra_args is left to stand
#   (the op then adds nothing) and is named by a lint.
# - the overlap scheduler: for EAGLE/EAGLE3 it is spec v2's overlap of the CPU scheduler
#   with the GPU, on unless --disable-overlap-schedule (arg_groups/fields/schedule.py:193;
#   arg_groups/speculative_hook.py:1096-1102 turns it off only on CPU and warns that
#   "Non-overlap (synchronous) spec v2" runs otherwise): the op leaves it on, a lint names
#   the flag in extra_args.
# - the attention backend: 0.5.23 picks FA3 on Hopper when topk is 1
#   (arg_groups/model_override_base.py:277-313 get_default_attn_backend, "unless user use
#   spec decode with topk > 1"), trtllm_mha on Blackwell, flashinfer or triton elsewhere,
#   and the EAGLE3 drafter takes the target's decode backend
#   (speculative/draft_worker_common.py:36-46): the fastest per GPU, so the op does not pin
#   one (fa3 would not start on an A100); bench.json records the resolved one.
# - the draft vocabulary: for EAGLE3 SGLang ignores --speculative-token-map ("EAGLE3 models
#   already have this", eagle_worker_v2.py:324-330); the drafter's LM head is its config's
#   draft_vocab_size (models/llama_eagle3.py:306-318), set by the vocab stage; a lint warns
#   when it spans the whole target vocabulary.
DECODE_GRAPH_FLAGS = ("--cuda-graph-backend-decode", "--disable-decode-cuda-graph", "--disable-cuda-graph",
                      "--cuda-graph-config")
CYCLE_ARGS = ["--cuda-graph-backend-decode", "full"]
PP_FLAGS = ("--pp-size", "--pipeline-parallel-size")
MOE_DP_FLAGS = ("--moe-dp-size", "--moe-data-parallel-size")
MODES = ("target", "speculative")
ALGORITHMS = ("EAGLE3", "EAGLE")
DRAFTER_ARCH = "LlamaForCausalLMEagle3"


def server_argv(p: dict[str, Any], model_path: str) -> list[str]:
    """SGLang's flags (without the interpreter and module) for the stage's
    effective params `p` (serve's SPEC.effective: every Param is there)."""
    out = ["--model-path", str(model_path),
           "--tp-size", str(int(p["tp"])),
           "--dp-size", str(int(p["dp"])),
           "--ep-size", str(int(p["ep"])),
           "--host", str(p["host"]),
           "--port", str(int(p["port"]))]
    if p.get("mem_fraction_static") not in (None, ""):
        out += ["--mem-fraction-static", str(float(p["mem_fraction_static"]))]
    if p.get("context_length") not in (None, ""):
        out += ["--context-length", str(int(p["context_length"]))]
    if p["enable_metrics"]:
        out.append("--enable-metrics")       # /metrics: the live figures of the console
    if p["mode"] == "speculative":
        out += ["--speculative-algorithm", str(p["speculative_algorithm"]),
                "--speculative-draft-model-path", str(drafter_dir(Path(str(p.get("drafter"))))),
                "--speculative-num-steps", str(int(p["num_steps"])),
                "--speculative-eagle-topk", str(int(p["topk"])),
                "--speculative-num-draft-tokens", str(int(p["num_draft_tokens"]))]
        if not set(flags(extra_args_of(p.get("extra_args")))) & set(DECODE_GRAPH_FLAGS):
            out += CYCLE_ARGS
    return out + extra_args_of(p.get("extra_args"))


def _flag_int(args: Sequence[str], names: Sequence[str], default: int = 1) -> int:
    """The last value extra_args gives one of `names` (`--x 2` or `--x=2`), as argparse keeps it."""
    value = default
    for i, a in enumerate(args):
        name, eq, rest = a.partition("=")
        if name in names:
            raw = rest if eq else (args[i + 1] if i + 1 < len(args) else "")
            try:
                value = int(raw)
            except ValueError:
                pass        # SGLang's parser refuses it before launch
    return value



def _target_arch(model_path: str | None, target: dict[str, Any]) -> str | None:
    if model_path:
        cfg = read_json(Path(model_path) / "config.json")
        if cfg and cfg.get("architectures"):
            return str(cfg["architectures"][0])
        if cfg and cfg.get("model_type"):
            return str(cfg["model_type"])
    return target.get("architecture")


def drafter_dir(path: Path) -> Path:
    """An export output root holds sglang/; a path to that folder is taken as it is."""
    return path / "sglang" if (path / "sglang" / "config.json").exists() else path


def lint(p: dict[str, Any], model_path: str | None, gpus: Sequence[int] | None,
         target: dict[str, Any] | None = None) -> list[Lint]:
    """What is wrong with a serve stage before anything starts, each with its reason;
    `p`: its effective params (serve's SPEC.effective)."""
    target = target or {}
    out: list[Lint] = []
    tp, dp, ep = (int(p[k]) for k in ("tp", "dp", "ep"))
    # mode, speculative_algorithm, ready_timeout_s and mem_fraction_static are
    # checked against their Params (ops/serve/spec.py) before this runs: by the
    # console at `run`, by argparse in `python -m ops.serve`.
    mode = p["mode"]
    if not model_path:
        out.append(Lint("error", "no model: set params.model_path or [target].path"))
    try:
        extra = extra_args_of(p.get("extra_args"))
    except ValueError as exc:
        extra, bad_extra = [], Lint("error", str(exc))
    else:
        bad_extra = None
    # compute_world_size in python/sglang/srt/server_args.py: dp * tp * pp GPUs. The
    # deprecated --enable-dp-attention makes dp attention DP inside the TP group
    # (_handle_deprecated_dp_attention, arg_groups/parallel_hook.py): no GPUs of its own.
    pp = _flag_int(extra, PP_FLAGS)
    replicas = 1 if "--enable-dp-attention" in flags(extra) else dp
    world = tp * replicas * pp
    shape = f"tp {tp} x dp {replicas}" + (f" x pp {pp}" if pp != 1 else "")
    if gpus is None:
        out.append(Lint("warning", f"no `gpus` list: SGLang takes the first {shape} = {world} visible GPUs"))
    elif len(gpus) != world:
        out.append(Lint("error", f"{shape} = {world} GPUs, but the stage's gpus list has "
                                 f"{len(gpus)} ({','.join(map(str, gpus))}); SGLang needs exactly tp x dp x pp"))
    moe_dp = _flag_int(extra, MOE_DP_FLAGS)
    if ep > 1 and ep * moe_dp != tp:
        # python/sglang/srt/arg_groups/parallel_hook.py: "ep_size * moe_dp_size must be equal to tp_size".
        if moe_dp == 1:
            out.append(Lint("error", f"ep {ep} with tp {tp}: SGLang requires ep x moe_dp_size == tp "
                                     f"(moe_dp_size defaults to 1, so ep = tp)"))
        else:
            out.append(Lint("error", f"ep {ep} x moe_dp_size {moe_dp} = {ep * moe_dp}, but tp is {tp}: "
                                     f"SGLang requires ep x moe_dp_size == tp"))
    if bad_extra is not None:
        return out + [bad_extra]
    for flag in flags(extra):
        if flag in MANAGED:
            out.append(Lint("error", f"extra_args sets {flag}, which the serve op sets from param "
                                     f"{MANAGED[flag]!r}: set that param instead"))
        elif flag in REMOVED_FLAGS:
            out.append(Lint("error", f"extra_args {flag}: not a flag of sglang {PINNED_SGLANG} "
                                     f"(removed); use {REMOVED_FLAGS[flag]}"))
        elif flag in DEPRECATED_FLAGS:
            out.append(Lint("warning", f"extra_args {flag}: deprecated in sglang {PINNED_SGLANG}; "
                                       f"use {DEPRECATED_FLAGS[flag]}"))
    if mode == "speculative":
        out += _lint_cycle(extra)
        out += _lint_speculative(p, model_path, target)
    return out


def _lint_cycle(extra: list[str]) -> list[Lint]:
    """extra_args that lengthen a speculative server's verify cycle (CYCLE_ARGS' comment)."""
    out: list[Lint] = []
    given = flags(extra)
    if "--disable-overlap-schedule" in given:
        out.append(Lint("warning", "extra_args --disable-overlap-schedule: every verify cycle then waits for the "
                                   "CPU scheduler (SGLang runs spec v2 without overlap)"))
    off = [f for f in ("--disable-cuda-graph", "--disable-decode-cuda-graph") if f in given]
    for i, a in enumerate(extra):
        name, eq, rest = a.partition("=")
        value = rest if eq else (extra[i + 1] if i + 1 < len(extra) else "")
        if name == "--cuda-graph-backend-decode" and value == "disabled":
            off.append(f"{name} disabled")
    for f in off:
        out.append(Lint("warning", f"extra_args {f}: the drafter's draft and draft-extend steps and the target's "
                                   f"verify run without CUDA graphs, every kernel launched one by one"))
    if "--speculative-token-map" in given:
        out.append(Lint("warning", "extra_args --speculative-token-map: SGLang ignores it for EAGLE3; the draft "
                                   "vocabulary is the drafter's draft_vocab_size (the vocab stage's)"))
    return out


def _lint_speculative(p: dict[str, Any], model_path: str | None, target: dict[str, Any]) -> list[Lint]:
    out: list[Lint] = []
    algo = p["speculative_algorithm"]
    steps, topk, ndt = int(p["num_steps"]), int(p["topk"]), int(p["num_draft_tokens"])
    if topk == 1 and ndt != steps + 1:
        # python/sglang/srt/arg_groups/speculative_hook.py (_handle_eagle_family).
        out.append(Lint("warning", f"num_draft_tokens {ndt} with topk 1: SGLang adjusts it to "
                                   f"num_steps + 1 = {steps + 1}"))
    if not p.get("drafter"):
        return out + [Lint("error", "mode speculative needs params.drafter (export's output directory)")]
    ddir = drafter_dir(Path(str(p["drafter"])))
    config = read_json(ddir / "config.json")
    if config is None:
        return out + [Lint("error", f"{ddir / 'config.json'}: missing or not JSON; expected an SGLang "
                                    f"drafter export ({DRAFTER_ARCH})")]
    if algo == "EAGLE3" and DRAFTER_ARCH not in (config.get("architectures") or []):
        out.append(Lint("error", f"{ddir / 'config.json'}: architectures {config.get('architectures')}, "
                                 f"expected [{DRAFTER_ARCH!r}] for EAGLE3"))
    dv, tv = config.get("draft_vocab_size"), config.get("vocab_size")
    if isinstance(tv, int) and (dv is None or dv == tv):
        out.append(Lint("warning", f"{ddir / 'config.json'}: draft_vocab_size {dv if dv is not None else 'unset'}: "
                                   f"the drafter's LM head spans the whole vocabulary ({tv}), each draft step "
                                   f"pays for it; the vocab stage's draft_vocab_size shortens the cycle"))
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    arch = _target_arch(model_path, target)
    info = read_json(ddir.parent / "export_info.json") or {}
    want = info.get("sglang_layers_to_capture")
    if want is None and info.get("layer_ids") is not None:
        want = layers.sglang_capture_ids(info["layer_ids"])
    if ids is None:
        out.append(Lint("warning", f"{ddir / 'config.json'}: no eagle_config.eagle_aux_hidden_state_layer_ids; "
                                   f"SGLang captures its default layers"))
    elif arch is None:
        out.append(Lint("warning", "target architecture unknown (no config.json at the model path, no "
                                   "[target].architecture): the drafter's aux layer ids are not checked"))
    elif want is None:
        out.append(Lint("warning", f"{ddir.parent / 'export_info.json'}: missing; which layers the drafter "
                                   f"was trained on is unknown, its aux ids {ids} are not checked"))
    else:
        got = layers.apply_sglang_rule(arch, ids)
        if got != [int(v) for v in want]:
            out.append(Lint("error", f"drafter aux ids {ids} make SGLang capture {got} on {arch} "
                                     f"({layers.sglang_rule(arch)} rule), but the drafter was trained on "
                                     f"capture {list(want)}; re-export for this target"))
    return out


def errors(lints: Sequence[Lint]) -> list[Lint]:
    return [x for x in lints if x.level == "error"]
