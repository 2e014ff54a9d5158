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
and writes. Followers write nothing and print no progress.

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

from ops.common import BadInput
from ops.extract import sglang_args, sglang_capture, sglang_engine
from ops.extract import target as target_mod
from ops.extract.loop import _Loop, log
from ops.layers import engine_ids, parse_layer_ids

METHOD = "sglang"
_GATE_KEY = "eagle3_console/extract_sglang/gate"


def check(args) -> str:
    """The pinned SGLang first, then the params; BadInput (one line, exit 2) otherwise."""
    try:
        version = sglang_engine.check_version()
    except sglang_engine.EngineVersionError as exc:
        raise BadInput(str(exc)) from None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.tp < 1 or args.ep < 1:
        raise BadInput(f"engine sglang: tp and ep must be at least 1, got tp {args.tp}, ep {args.ep}")
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
    if args.mem_fraction_static is not None and not 0.0 < args.mem_fraction_static < 1.0:
        # SGLang's parser takes any float: the pools would be sized from it after the load.
        raise BadInput(f"engine sglang: mem_fraction_static {args.mem_fraction_static}: expected a fraction "
                       f"between 0 and 1")
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
    return version


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


def tp_coords() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return rank, world, int(os.environ.get("LOCAL_RANK", str(rank)))


def data_coords() -> tuple[int, int, int]:
    """run.py's (rank, world, local rank): the leader is the whole data world."""
    return 0, 1, tp_coords()[2]


def config_keys(args, version: str) -> dict:
    return {"extraction_method": METHOD, "sglang_version": version, "tp": args.tp, "ep": args.ep}


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


def extract(args, leader) -> int:
    """Rank 0 runs `leader()` (run.py's loop); the other ranks follow it."""
    version = check(args)
    _plan(args)     # a target SGLang cannot capture from is refused before any rank loads
    rank, world, local = tp_coords()
    args.sglang_version = version
    gate = _Gate() if world > 1 else None
    args.sglang_gate = gate
    if rank == 0:
        try:
            return leader()
        finally:
            if gate is not None:
                gate.say("exit")    # a no-op once "load" was said
    return follow(args, gate, rank, local)


def _plan(args):
    """What every rank derives alike from the params and the target's config."""
    info = target_mod.read_target(Path(args.target))
    try:
        layer_ids = parse_layer_ids(args.layer_ids, info.num_layers)
    except ValueError as exc:
        raise BadInput(f"target {info.path}: {exc}") from exc
    ids = engine_ids(layer_ids, info.num_layers, info.architecture or info.model_type)
    if ids.get("sglang_config_layer_ids") is None:
        raise BadInput(f"target {info.path}: engine sglang: {ids.get('sglang_config_error')}")
    dtype = target_mod.resolve_dtype(args.dtype, info)
    argv = sglang_capture.server_argv(target=str(info.path), tp=args.tp, ep=args.ep, dtype=dtype,
                                      context_length=context_length(args.max_seq_len, info.path),
                                      config_layer_ids=ids["sglang_config_layer_ids"],
                                      mem_fraction_static=args.mem_fraction_static,
                                      extra_args=extra_args(args))
    try:
        sglang_capture.server_args(argv)
    except ValueError as exc:
        raise BadInput(f"engine sglang: extra_args {extra_args(args)}: SGLang's parser: {exc}") from None
    except ImportError:
        pass        # a --no-deps install: load() says so in one line
    return info, layer_ids, ids, argv


def load_target(args, rank: int, local: int):
    info, layer_ids, ids, argv = _plan(args)
    target = sglang_capture.load(argv, tp_rank=rank, gpu_id=local,
                                 expected_capture=ids["sglang_layers_to_capture"], n_aux=len(layer_ids))
    if tp_coords()[1] > 1:
        import torch.distributed as dist

        limits = torch.tensor([target.max_reqs, target.max_tokens], dtype=torch.int64)
        dist.all_reduce(limits, op=dist.ReduceOp.MIN, group=sglang_capture.tp_cpu_group())
        target.max_reqs, target.max_tokens = (int(v) for v in limits.tolist())
    return target


def leader_loop(info, dtype, layer_ids, samples, lengths, out_dir, done, args):
    """run.py's dispatch point: the leader's loop over a target SGLang holds."""
    rank, world, local = tp_coords()
    gate = getattr(args, "sglang_gate", None)
    if gate is not None:
        gate.say("load")
    log(f"loading target {info.path} in SGLang {args.sglang_version} (tp {args.tp}, ep {args.ep}, {dtype})")
    t0 = time.monotonic()
    target = load_target(args, rank, local)
    log(f"target loaded in {(time.monotonic() - t0) / 60:.1f} minutes")
    group = sglang_capture.tp_cpu_group() if world > 1 else None
    return SGLangLoop(target, samples, lengths, out_dir, done, args, group)


def follow(args, gate, rank: int, local: int) -> int:
    if gate.wait() != "load":
        return 0
    import torch.distributed as dist

    target = load_target(args, rank, local)
    group = sglang_capture.tp_cpu_group()
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=group)
        if box[0] is None:
            return 0
        try:
            target.forward(box[0])
        except torch.cuda.OutOfMemoryError:
            # The leader hit it too (same shapes): it halves and sends the pieces.
            torch.cuda.empty_cache()


class _LeaderTarget:
    """The leader's target: each forward's tokens go to the followers first."""

    def __init__(self, target, group) -> None:
        self.target, self.group = target, group

    def forward(self, token_lists):
        if self.group is not None:
            import torch.distributed as dist

            dist.broadcast_object_list([token_lists], src=0, group=self.group)
        return self.target.forward(token_lists)

    def close(self) -> None:
        if self.group is not None:
            import torch.distributed as dist

            dist.broadcast_object_list([None], src=0, group=self.group)
            self.group = None
        self.target.close()


class SGLangLoop(_Loop):
    """run.py's loop with SGLang's packed forward in place of the HF capture;
    run(), the writers, progress and the OOM halving are _Loop's own."""

    def __init__(self, target, samples, lengths, out_dir, done, args, group=None) -> None:
        self.capture = _LeaderTarget(target, group)
        self.samples, self.lengths, self.out_dir, self.done = samples, lengths, out_dir, done
        self.args, self.rank, self.world = args, 0, 1
        self._copy_streams: dict = {}
        self._pool = None

    def _forward(self, batch: list[int]) -> None:
        rows = [(idx, *self.samples.get(idx)) for idx in batch]
        # Samples already on disk stay in: the batch keeps the planned shape.
        aux, final = self.capture.forward([tok.tolist() for _idx, tok, _loss in rows])
        pieces, start = [], 0
        for idx, tok, loss in rows:
            n = len(tok)
            if idx not in self.done:
                pieces.append((idx, tok, loss, aux[start:start + n], final[start:start + n]))
            start += n
        self._submit(aux, final, pieces)
