"""A training run: train() builds what it needs (ops/train/setup.py's steps),
then the Loop: optimizer steps until the schedule's last (or stop_at),
each W ranks x grad_accum micro-batches; a window's record (the progress
line, metrics.jsonl, the report) every log_every steps; a checkpoint every
save_every.

Where it sits: ops/train/__main__.py parses the flags, calls train() and
maps its errors to exit codes; the prefetcher (ops/train/prefetch.py)
feeds the loop batches already on the device.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ops.common import BadInput, progress
from ops.train.setup import (Place, Plan, build_model, init_place, make_optimizer, open_output, plan_batches,
                             read_inputs, train_dtype, write_train_config)
from ops.train.online import args_online, bound_words
from ops.train.targets import out_of_vocab

# The held-out acceptance (ops/train/heldout.py) is measured at most this often, and at the last step.
HELDOUT_EVERY_S = 60.0


def train(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> int:
    """The run, step by step; its exit code (3: the loss went non-finite)."""
    from ops.train.owner import OwnerError, begin, load_resumed

    place = init_place(args)
    output = Path(args.output)
    report = open_output(args, output, place)
    inputs = read_inputs(args)
    model, levers, view = build_model(args, place, inputs)
    # The view holds what the steps need of the target's head: the host copy may go.
    info, cfg = inputs.info, inputs.cfg
    del inputs
    plan = plan_batches(args, place, info, levers)
    opt, sched = make_optimizer(args, model, levers, plan.total)
    if args.mode == "online":
        from ops.train.online import load_target

        load_target(info, args, place)
    # export's check and bench read the held-out samples' states from `data`: an
    # online run names prepare's samples instead (`samples`), and no `data`.
    inputs_meta = ({"data": str(Path(args.data).resolve())} if args.mode == "offline"
                   else {"samples": str(Path(args.samples).resolve()), "layer_ids": info.layer_ids,
                         **({"spool": str(Path(args.spool).resolve())} if args.mode == "streamed" else {})})
    meta_base = {"drafter_config": cfg.to_dict(), "target": str(Path(args.target).resolve()),
                 "mode": args.mode, **inputs_meta, "vocab": str(Path(args.vocab).resolve()),
                 "holdout": plan.held, "world_size": place.world, "grad_accum": args.grad_accum,
                 "ttt_steps": args.ttt_steps, "total_steps": plan.total}
    try:
        start = begin(output, args.resume, args.replace_checkpoints, cfg.to_dict(), place.is_main, place.log)
    except OwnerError as exc:
        raise BadInput(str(exc)) from None
    if args.mode == "streamed" and place.world > 1:
        raise BadInput("mode streamed: a spool has one consumer; run it without torchrun (or mode online, "
                       "where each rank holds the target)")
    if args.mode == "streamed":
        # The spool is this run's (its token), and the producer's format is how its files are read.
        info.claim(start.run.token, plan.train_ids, plan.held, args.resume)
        info.wait_for_producer_config()
    step = load_resumed(start, model, opt, sched, place.device)
    ddp = (DDP(model, device_ids=[place.local_rank] if place.use_cuda else None, broadcast_buffers=False)
           if place.world > 1 else model)
    write_train_config(place, output, dict(meta_base, run=start.run.to_dict(), args=vars(args)))
    loop = Loop(args, place, info, plan, model, ddp, levers, view, opt, sched, report, meta_base, start, cleanup)
    exit_code = loop.run(step)
    if place.world > 1:
        dist.destroy_process_group()
    return exit_code


class Loop:
    def __init__(self, args: argparse.Namespace, place: Place, info, plan: Plan, model, ddp, levers, view,
                 opt, sched, report, meta_base: dict, start, cleanup: contextlib.ExitStack) -> None:
        from ops.train.heldout import HeldOut

        self.args, self.place, self.info, self.plan = args, place, info, plan
        self.model, self.ddp, self.view, self.opt, self.sched = model, ddp, view, opt, sched
        self.levers, self.report, self.meta_base, self.start, self.cleanup = levers, report, meta_base, start, cleanup
        self.output = Path(args.output)
        self.metrics_path = self.output / "metrics.jsonl"
        self.dtype = train_dtype(place)
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if place.use_cuda else contextlib.nullcontext()
        self.heldout = HeldOut(info, plan.held if place.is_main else [], args.token_budget, args.max_len,
                               levers.length_bucket)
        self.ho, self.ho_t, self.ho_step = None, None, 0
        self.window_tokens, self.window_t0 = 0, time.monotonic()
        self.epoch = 0

    def run(self, step: int) -> int:
        """Steps from `step` (0, or the resumed checkpoint's) on; the exit code (3: the loss went non-finite)."""
        from ops.drafter import checkpoint as ck
        from ops.train.prefetch import DevicePrefetcher

        args, place, plan, info = self.args, self.place, self.plan, self.info
        it = DevicePrefetcher((dict(batch, epoch=e) for e, batch in self._stream(step * args.grad_accum)),
                              place.device, self.dtype, fmt=info.format, hidden=info.hidden_size)
        self.cleanup.callback(it.close)
        self.it, self.wait_mark = it, 0.0
        place.log(f"train: {len(info.samples)} samples ({len(plan.train_ids)} train, {len(plan.held)} held out), "
                  f"{len(plan.batches)} batches, {place.world} rank(s) x accum {args.grad_accum}, {plan.total} "
                  f"steps, ttt {args.ttt_steps}, device {place.device}; {self.levers.describe()}; "
                  f"{info.describe()}")
        # One line per refresh (not tqdm's carriage returns): the log is a file
        # that other lines are printed into between refreshes.
        bar = progress(total=plan.total, initial=step, disable=not place.is_main, desc="train", unit="step",
                       mininterval=2.0)
        self.window_tokens, self.window_t0 = 0, time.monotonic()
        self.epoch = step * args.grad_accum // plan.per_epoch
        exit_code = 0
        while step < plan.total:
            self.model.train()
            sums = self._accumulate(it)
            if not math.isfinite(float(sums[3 * args.ttt_steps])):
                print(f"error: loss is not finite at step {step + 1}", file=sys.stderr, flush=True)
                exit_code = 3
                break
            grad_norm = self._optimizer_step()
            step += 1
            self._reduce(sums)
            self.window_tokens += int(sums[3 * args.ttt_steps + 1])
            bar.update(1)
            if step % args.log_every == 0 or step == plan.total:
                self._record(step, sums, grad_norm)
            stopping = step == args.stop_at
            if step % args.save_every == 0 or step == plan.total or stopping:
                self._save(step, sums)
            if stopping:
                place.log(f"stop-at: leaving after step {step} of {plan.total}")
                break
        bar.close()
        if self.report is not None:
            self.report.close()
        if exit_code == 0:
            self.info.finish()
            place.log(f"done: {step} steps; newest checkpoint {ck.newest(self.output)}")
        return exit_code

    def _stream(self, consumed: int):
        """Micro-batches from position `consumed` (per rank) onwards, across epochs."""
        from ops.drafter.data import batch_loader

        sampler, per_epoch = self.plan.sampler, self.plan.per_epoch
        epoch, skip = divmod(consumed, per_epoch)
        # The run's micro-batches and no more: the prefetcher reads ahead, and a streamed run's
        # plan past the last step would have the producer extract what nobody reads.
        left = self.plan.total * self.args.grad_accum - consumed
        while left > 0:
            sampler.set_epoch(epoch)
            order = list(iter(sampler))[skip:][:left]
            left -= len(order)
            # No pin_memory: its thread would copy each batch once more in this
            # process; the prefetcher's own thread (ops/train/prefetch.py), which
            # iterates this, copies straight from the workers' shared memory to
            # the device (benchmarks/RESULTS.md, train_throughput, measures both).
            # Online, the target's forward makes each batch: in this process, where it is loaded;
            # streamed, the spool's plan for the epoch goes out first, and the batches wait for it here.
            workers = self.args.workers if self.args.mode == "offline" else 0
            self.info.begin_epoch(epoch, skip, [self.plan.batches[b] for b in order])
            for batch in batch_loader(self.plan.dataset, order, workers):
                yield epoch, batch
            epoch, skip = epoch + 1, 0

    def _accumulate(self, it):
        """One optimizer step's micro-batches, forward and backward; their sums
        (loss_k, correct_k, count_k per TTT step, the loss, the tokens)."""
        args, view = self.args, self.view
        k = args.ttt_steps
        sums = torch.zeros(3 * k + 2, device=self.place.device)
        for micro in range(args.grad_accum):
            batch, dev = it.next()
            self.epoch = batch["epoch"]
            bad = out_of_vocab(batch, self.info, view.embed.shape[0], args.target)
            if bad:
                # Checked on the CPU copy: on the device the embedding lookup is
                # a bare IndexError (a device-side assert on CUDA) naming nothing.
                raise BadInput(bad)
            tgt, ok = view.targets(dev["final"], dev["loss_mask"], dev["lengths"])
            last = self.place.world == 1 or micro == args.grad_accum - 1
            with (contextlib.nullcontext() if last else self.ddp.no_sync()), self.autocast:
                loss, losses, correct, counts = self.ddp(dev["input_ids"], dev["aux"], view.embed, tgt, ok,
                                                         k, args.decay)
                (loss / args.grad_accum).backward()
            sums[:k] += losses / args.grad_accum
            sums[k:2 * k] += correct
            sums[2 * k:3 * k] += counts
            sums[3 * k] += loss.detach() / args.grad_accum
            sums[3 * k + 1] += batch["lengths"].sum()
        return sums

    def _optimizer_step(self):
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return grad_norm

    def _reduce(self, sums) -> None:
        """The ranks' sums, added; the losses averaged over the ranks."""
        world, k = self.place.world, self.args.ttt_steps
        if world > 1:
            dist.all_reduce(sums)
            sums[:k] /= world
            sums[3 * k] /= world

    def _record(self, step: int, sums, grad_norm) -> None:
        """The window's record: the progress line, metrics.jsonl and the report (rank 0)."""
        from ops.drafter import diskio
        from ops.drafter.metrics import simulated_acceptance_length

        k, total = self.args.ttt_steps, self.plan.total
        elapsed = max(1e-9, time.monotonic() - self.window_t0)
        acc = (sums[k:2 * k] / sums[2 * k:3 * k].clamp(min=1)).tolist()
        # At most once a HELDOUT_EVERY_S (and at the end): on a real job's holdout the walk
        # costs seconds, and a window is logged every few steps.
        if step == total or self.ho_t is None or time.monotonic() - self.ho_t >= HELDOUT_EVERY_S:
            with self.autocast:
                self.ho = self.heldout.measure(self.model, self.view, k, self.place.device, self.dtype)
            self.ho_t, self.ho_step = time.monotonic(), step
        ho = self.ho
        rec = {"step": step, "total": total, "epoch": self.epoch, "loss": float(sums[3 * k]),
               "step_loss": [round(float(x), 5) for x in sums[:k]],
               "acc": [round(a, 4) for a in acc], "counted": [int(c) for c in sums[2 * k:3 * k]],
               "simulated_acceptance_length": round(ho["acceptance_length"] if ho
                                                    else simulated_acceptance_length(acc), 4),
               "tok_s": self.window_tokens / elapsed, "lr": self.sched.get_last_lr()[0],
               "grad_norm": float(grad_norm)}
        if args_online(self.args):
            rec["online"] = self._online_window(elapsed)
        if ho:
            rec["heldout"] = {"step": self.ho_step, "tokens": ho["tokens"], "verifies": ho["verifies"],
                              "by_depth": [round(a, 4) for a in ho["by_depth"]],
                              "acc": [round(a, 4) for a in ho["acc"]]}
        if self.place.is_main:
            print(f"progress: step {step}/{total} loss {rec['loss']:.4f} "
                  f"acc [{','.join(f'{a:.3f}' for a in acc)}] tok/s {rec['tok_s']:.0f} "
                  f"lr {rec['lr']:.3e} epoch {self.epoch}", flush=True)
            if "online" in rec:
                print(f"online: {bound_words(rec['online'])}", flush=True)
            with diskio.naming(self.metrics_path), open(self.metrics_path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            if self.report is not None:
                self.report.log(rec)
        self.window_tokens, self.window_t0 = 0, time.monotonic()

    def _online_window(self, elapsed: float) -> dict:
        """The window's two sides (the target's forwards or the spool's producer,
        and the drafter's steps): the time the steps waited for a batch is the
        prefetcher's, the rest the state's own (online.py, streamed.py)."""
        waited = self.it.wait_s - self.wait_mark
        self.wait_mark = self.it.wait_s
        return self.info.window(elapsed, waited, self.window_tokens)

    def _save(self, step: int, sums) -> None:
        """A checkpoint by rank 0; every rank waits for it."""
        from ops.drafter import checkpoint as ck

        if self.place.is_main:
            path = ck.save(self.output, step, self.model.trainable_state(),
                           {"optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()},
                           dict(self.meta_base, loss=float(sums[3 * self.args.ttt_steps])), self.args.keep,
                           self.start.run, self.start.own)
            print(f"checkpoint: {path}", flush=True)
        if self.place.world > 1:
            dist.barrier()
