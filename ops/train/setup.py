"""What a training run builds before its first step, in named steps: place
this process, open the output, read the inputs, build the drafter, plan the
batches, make the optimizer, write train_config.json.

Where it sits: ops/train/loop.py's train() calls these in order, then runs
its Loop. torch is imported here; ops/train/__main__.py imports this only
once the flags are parsed, so the parser (--help, the console's lint) stays
cheap.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ops.common import BadInput, torchrun_coords, wants_cuda
from ops.train.levers import Levers, resolve
from ops.train.targets import TargetView


@dataclass(frozen=True)
class Place:
    """This process in the torchrun world, and the device it trains on."""

    rank: int
    world: int
    local_rank: int
    use_cuda: bool
    device: Any

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def log(self, msg: str) -> None:
        if self.is_main:
            print(msg, flush=True)


@dataclass(frozen=True)
class Inputs:
    """What training reads: the extracted data, the target's head, the vocab, the drafter's config."""

    info: Any
    head: Any
    vocab: Any
    cfg: Any


@dataclass(frozen=True)
class Plan:
    """The batches of one rank, the held-out samples, and the schedule's length."""

    train_ids: list[int]
    held: list[int]
    batches: list
    dataset: Any
    sampler: Any
    per_epoch: int          # micro-batches per rank per epoch
    total: int              # optimizer steps


def lr_lambda(total: int, warmup: int, min_ratio: float):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(1, total - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return f


def init_place(args: argparse.Namespace) -> Place:
    """Where this process trains: its torchrun rank, its GPU (or the CPU), the process group."""
    rank, world, local_rank = torchrun_coords()
    use_cuda = wants_cuda(args.device)
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Place(rank, world, local_rank, use_cuda, device)


def open_output(args: argparse.Namespace, output: Path, place: Place):
    """The refusals that need nothing loaded (another run's checkpoints, a report
    backend that is missing), then the report (TensorBoard or none)."""
    from ops.train.owner import OwnerError, refuse_early
    from ops.train.report import ReportError, open_report

    try:
        refuse_early(output, args.resume, args.replace_checkpoints)
        return open_report(args.report_to, output, write=place.is_main)
    except (ReportError, OwnerError) as exc:
        raise BadInput(str(exc)) from None


def read_inputs(args: argparse.Namespace) -> Inputs:
    """The data's header (offline) or prepare's samples and the target's config
    (online: ops/train/online.py), the target's head and the vocab, checked
    against one another."""
    from ops.drafter.config import from_target
    from ops.drafter.data import read_data
    from ops.drafter.target_head import load_target_head
    from ops.drafter.vocab import load_vocab

    if args.mode == "offline" and not args.data:
        raise BadInput("mode offline needs data (extract's output directory: --data, `data = ...`); "
                       "or mode online with samples (prepare's output) and no states on disk")
    try:
        head = load_target_head(Path(args.target))
        if args.mode == "online":
            from ops.train.online import open_online

            info = open_online(args, head.embed.shape[0])
        elif args.mode == "streamed":
            from ops.train.streamed import open_streamed

            info = open_streamed(args, head.embed.shape[0], lambda msg: print(msg, flush=True))
        else:
            info = read_data(Path(args.data))
        vocab = load_vocab(Path(args.vocab), target_vocab_size=head.lm_head.shape[0])
        cfg = from_target(Path(args.target), vocab.size, info.layer_ids,
                          {"num_attention_heads": args.num_heads, "num_key_value_heads": args.num_kv_heads,
                           "intermediate_size": args.intermediate_size})
    except (ValueError, OSError) as exc:
        from ops.drafter.data import FormatError
        from ops.hidden_formats import BadFormat

        raise (BadFormat if isinstance(exc, FormatError) else BadInput)(str(exc)) from None
    if info.hidden_size != cfg.hidden_size:
        from ops.formats import DATA_CONFIG

        raise BadInput(f"{info.root / DATA_CONFIG}: hidden_size {info.hidden_size} != the target's "
                       f"{cfg.hidden_size} ({args.target}/config.json)")
    return Inputs(info, head, vocab, cfg)


def build_model(args: argparse.Namespace, place: Place, inputs: Inputs) -> tuple[Any, Levers, TargetView]:
    """The drafter, initialised from the target's head, on the device with its
    levers set; and the frozen target's view the steps read their targets from."""
    from ops.drafter.model import Eagle3Drafter

    torch.manual_seed(args.seed)
    model = Eagle3Drafter(inputs.cfg)
    model.init_from_target(inputs.head.lm_head, inputs.vocab.d2t, inputs.vocab.t2d)
    levers = resolve(place.use_cuda, args.ttt_attention, args.loss, args.fused_adamw, args.compile,
                     args.length_bucket)
    model.ttt_attention, model.loss, model.compile_step = levers.ttt_attention, levers.loss, levers.compile
    model.to(place.device)
    view = TargetView(inputs.head, inputs.vocab, place.device, train_dtype(place), inputs.info.final_post_norm)
    return model, levers, view


def train_dtype(place: Place):
    return torch.bfloat16 if place.use_cuda else torch.float32


def plan_batches(args: argparse.Namespace, place: Place, info, levers: Levers) -> Plan:
    """The held-out split, the token-budget batches, this rank's sampler and the step count."""
    from torch.utils.data.distributed import DistributedSampler

    from ops.drafter.data import holdout_split, make_batches

    train_ids, held = holdout_split(sorted(info.samples), args.holdout, args.seed)
    batches = make_batches({i: info.lengths[i] for i in train_ids}, args.token_budget, args.max_len,
                           levers.length_bucket)
    dataset = info.dataset(batches, args.max_len, levers.length_bucket, args.token_budget)
    sampler = DistributedSampler(dataset, num_replicas=place.world, rank=place.rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    per_epoch = len(sampler)
    steps_per_epoch = per_epoch // args.grad_accum
    if steps_per_epoch == 0:
        raise BadInput(f"{len(batches)} batches cannot feed {place.world} rank(s) x {args.grad_accum} "
                       f"accumulation; lower --token-budget or --grad-accum")
    total = args.max_steps or args.epochs * steps_per_epoch
    return Plan(train_ids, held, batches, dataset, sampler, per_epoch, total)


def make_optimizer(args: argparse.Namespace, model, levers: Levers, total: int):
    """AdamW (no weight decay on vectors) and the warmup-then-cosine schedule."""
    decay, no_decay = [], []
    for _name, p in model.named_parameters():
        (no_decay if p.dim() < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            **({"fused": True} if levers.fused_adamw else {}))
    warmup = math.ceil(total * args.warmup_ratio)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total, warmup, args.min_lr_ratio))
    return opt, sched


def write_train_config(place: Place, output: Path, config: dict) -> None:
    """train_config.json, by rank 0: what this run was asked and which run it is."""
    from ops.drafter import diskio

    if place.is_main:
        output.mkdir(parents=True, exist_ok=True)
        with diskio.naming(output / "train_config.json"):
            (output / "train_config.json").write_text(json.dumps(config, indent=1))
