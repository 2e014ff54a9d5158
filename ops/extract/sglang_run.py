"""`extract` with engine = "sglang": the target held by SGLang with tp/ep.

Launch: one process per TP rank, WORLD_SIZE == tp:

    torchrun --standalone --nproc-per-node 8 -m ops.extract --engine sglang --tp 8 --ep 8 \\
        --target MODEL --input PREPARED --output DIR [...]

(tp 1 runs without torchrun). The TP group is ONE data-parallel unit: every
rank runs every forward (each holds a shard of every layer), so the samples
are not split r::WORLD_SIZE as with the HF engine. Rank 0 (the leader) runs
run.py's loop as a world of one: the same resume check, data_config.json,
progress lines, OOM halving, writers; it hands each batch's token ids to the
other ranks (followers) over the TP group's gloo group before its own forward,
and writes. Followers write nothing and print no progress. SGLangEngine is
this engine behind engine.py's Engine protocol; the version pin was checked
before it opens (engine.py open_engine).

Before the model load the followers wait at a gate in torchrun's own store:
the leader opens it ("load") when it gets as far as loading, or says "exit"
when it ends before (bad input, disk preflight, nothing left to extract), so a
follower never waits on a leader that has gone.

OOM with tp > 1: the halving works when every rank runs out of memory in the
same forward (the shapes are the same on every rank, so this is the usual
case: each catches it and waits for the leader's halved batch). A rank that
fails alone leaves the others in an NCCL collective until its timeout; the run
ends with exit 1 and a re-run resumes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from ops.common import BadInput, Coords, torchrun_coords
from ops.extract import sglang_args, sglang_capture
from ops.target_model import model as target_mod
from ops.target_model.output import TargetOutput
from ops.extract.loop import log
from ops.layers import engine_ids, parse_layer_ids

METHOD = "sglang"
_GATE_KEY = "eagle3_console/extract_sglang/gate"


def check(args) -> None:
    """The params this engine cannot honour; BadInput (one line, exit 2)."""
    world = torchrun_coords()[1]
    # tp, ep >= 1 and 0 < mem_fraction_static < 1: their Params (ops/extract/spec.py), checked by argparse.
    if args.tp % args.ep:
        raise BadInput(f"engine sglang: ep {args.ep} must divide tp {args.tp} (SGLang's moe_ep_size "
                       f"x moe_tp_size = tp_size)")
    if world != args.tp:
        raise BadInput(f"engine sglang: tp {args.tp} but {world} process(es) (WORLD_SIZE): launch one process "
                       f"per TP rank, torchrun --nproc-per-node {args.tp} -m ops.extract --engine sglang ...")
    if args.memory_fraction is not None:
        raise BadInput("engine sglang: memory_fraction is the HF engine's cap; SGLang sizes its own memory "
                       "from mem_fraction_static")
    if args.compile:
        raise BadInput("engine sglang: compile is the HF engine's (torch.compile of its decoder layers); "
                       "SGLang compiles its own kernels")
    try:
        extra = extra_args(args)
    except ValueError as exc:
        raise BadInput(f"engine sglang: {exc}") from None
    bad = [x.message for x in sglang_args.lint(vars(args) | {"extra_args": extra}, None) if x.level == "error"]
    if bad:
        raise BadInput("engine sglang: " + "; ".join(bad))
    if args.device not in ("auto", "cuda"):
        raise BadInput(f"engine sglang: device {args.device!r}: SGLang places rank r on GPU LOCAL_RANK; "
                       f"leave device at auto")


def extra_args(args) -> list[str]:
    return sglang_args.extra_args_of(getattr(args, "extra_args", None))


def context_length(max_seq_len: int, target: Path) -> int:
    """max_seq_len, capped at what SGLang derives from the config (ModelConfig
    _derive_context_length refuses a longer --context-length unless
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set): no sample is longer than
    the longest of prepare's, and none can be longer than the model's positions."""
    import json

    try:
        cfg = json.loads((Path(target) / "config.json").read_text())
    except (OSError, ValueError):
        return max_seq_len
    cfg = cfg.get("text_config") or cfg
    derived = [int(cfg[k]) for k in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
               if isinstance(cfg.get(k), int) and cfg[k] > 0]
    return min([max_seq_len, *derived[:1]])


class Plan:
    """What every rank derives alike from the params and the target's config:
    SGLang's argv and the capture it must report."""

    def __init__(self, args) -> None:
        info = target_mod.read_target(Path(args.target))
        try:
            layer_ids = parse_layer_ids(args.layer_ids, info.num_layers)
        except ValueError as exc:
            raise BadInput(f"target {info.path}: {exc}") from exc
        ids = engine_ids(layer_ids, info.num_layers, info.architecture or info.model_type)
        if ids.get("sglang_config_layer_ids") is None:
            raise BadInput(f"target {info.path}: engine sglang: {ids.get('sglang_config_error')}")
        dtype = target_mod.resolve_dtype(args.dtype, info)
        self.argv = sglang_capture.server_argv(target=str(info.path), tp=args.tp, ep=args.ep, dtype=dtype,
                                               context_length=context_length(args.max_seq_len, info.path),
                                               config_layer_ids=ids["sglang_config_layer_ids"],
                                               mem_fraction_static=args.mem_fraction_static,
                                               extra_args=extra_args(args))
        try:
            sglang_capture.server_args(self.argv)
        except ValueError as exc:
            raise BadInput(f"engine sglang: extra_args {extra_args(args)}: SGLang's parser: {exc}") from None
        except ImportError:
            pass        # a --no-deps install: load() says so in one line
        self.capture, self.n_aux = ids["sglang_layers_to_capture"], len(layer_ids)

    def load(self, rank: int, local: int, world: int):
        """This rank's SGLangTarget; every rank cuts a batch by the smallest rank's pools."""
        target = sglang_capture.load(self.argv, tp_rank=rank, gpu_id=local,
                                     expected_capture=self.capture, n_aux=self.n_aux)
        if world > 1:
            import torch.distributed as dist

            limits = torch.tensor([target.max_reqs, target.max_tokens], dtype=torch.int64)
            dist.all_reduce(limits, op=dist.ReduceOp.MIN, group=sglang_capture.tp_cpu_group())
            target.max_reqs, target.max_tokens = (int(v) for v in limits.tolist())
        return target


class SGLangEngine:
    """engine.py's Engine over SGLang: rank 0 leads (run.py's loop, a data
    world of one), the other TP ranks follow its forwards."""

    def __init__(self, args, version: str, plan: Plan, gate: "_Gate | None") -> None:
        self.tp, self.ep, self.version = args.tp, args.ep, version
        self.plan, self.gate = plan, gate
        self.rank, self.world, self.local = torchrun_coords()

    @classmethod
    def open(cls, args, version: str) -> "SGLangEngine":
        """The params checked, then the plan: a target SGLang cannot capture
        from is refused before any rank loads."""
        check(args)
        plan = Plan(args)
        gate = _Gate() if torchrun_coords()[1] > 1 else None
        return cls(args, version, plan, gate)

    def coords(self) -> Coords:
        return 0, 1, self.local

    def config_keys(self) -> dict:
        return {"extraction_method": METHOD, "sglang_version": self.version, "tp": self.tp, "ep": self.ep}

    def leads(self) -> bool:
        return self.rank == 0

    def load(self, info, dtype, layer_ids, placement) -> "LeaderTarget":
        if self.gate is not None:
            self.gate.say("load")
        log(f"loading target {info.path} in SGLang {self.version} (tp {self.tp}, ep {self.ep}, {dtype})")
        t0 = time.monotonic()
        target = self.plan.load(self.rank, self.local, self.world)
        log(f"target loaded in {(time.monotonic() - t0) / 60:.1f} minutes")
        return LeaderTarget(target, sglang_capture.tp_cpu_group() if self.world > 1 else None)

    def close(self) -> None:
        if self.gate is not None:
            self.gate.say("exit")    # a no-op once "load" was said

    def follow(self) -> int:
        if self.gate.wait() != "load":
            return 0
        import torch.distributed as dist

        target = self.plan.load(self.rank, self.local, self.world)
        group = sglang_capture.tp_cpu_group()
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0, group=group)
            if box[0] is None:
                _leave_group()
                return 0
            try:
                target.forward(box[0])
            except torch.cuda.OutOfMemoryError:
                # The leader hit it too (same shapes): it halves and sends the pieces.
                torch.cuda.empty_cache()


class LeaderTarget:
    """The leader's target (engine.py's Target): each forward's tokens go to
    the followers first; the packed states are cut back into samples."""

    def __init__(self, target, group) -> None:
        self.target, self.group = target, group

    def forward(self, tokens) -> TargetOutput:
        token_lists = [tok.tolist() for tok in tokens]
        if self.group is not None:
            import torch.distributed as dist

            dist.broadcast_object_list([token_lists], src=0, group=self.group)
        aux, final = self.target.forward(token_lists)
        return TargetOutput.packed(aux, final, [len(tok) for tok in token_lists])

    def close(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            import torch.distributed as dist

            dist.broadcast_object_list([None], src=0, group=group)
        self.target.close()
        if group is not None:
            _leave_group()


def _leave_group() -> None:
    """The ranks' process groups torn down once the last broadcast is through, while the
    interpreter is whole: rank 1 once aborted (SIGABRT, "terminate called without an active
    exception") after a complete extraction, in the teardown at the interpreter's exit. The rank
    then never reaches that exit (ops/common.exit_program): train's DDP ranks, which left their
    group, aborted there all the same."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class _Gate:
    """A word in torchrun's store (TORCHELASTIC_USE_AGENT_STORE: the agent hosts it at
    MASTER_ADDR:MASTER_PORT and outlives the workers), keyed per restart attempt."""

    def __init__(self) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            raise BadInput("engine sglang: tp > 1 needs torchrun (one process per TP rank)")
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(hours=24))
        self.store = dist.PrefixStore(f"{_GATE_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        self.said: str | None = None

    def say(self, word: str) -> None:
        if self.said is None:
            self.store.set("word", word)
            self.said = word

    def wait(self) -> str:
        self.store.wait(["word"])
        return self.store.get("word").decode()
