"""python -m ops.train: fit the EAGLE-3 drafter on the extract op's hidden states.

Data flow: extract's shards (+ vocab's vocab.safetensors, + the target's
embedding / final norm / LM head, read tensor by tensor) -> this program ->
<output>/checkpoints/step_<N>/ (read by export) and <output>/metrics.jsonl;
its log lines (`progress: step S/T loss L acc [..] tok/s X lr Y`, tqdm) are
parsed by the console's log monitor.

Multi-GPU / multi-node: launch under torchrun; DDP with NCCL on GPU, gloo on
CPU. One optimizer step = W ranks x --grad-accum micro-batches, so the global
batch of W ranks with accumulation A equals 1 rank with accumulation W*A.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from ops.common import BadInput, run_main
from ops.params import build_parser as spec_parser
from ops.train.levers import resolve
from ops.train.targets import TargetView, out_of_vocab
from ops.train.spec import SPEC

# The held-out acceptance (ops/train/heldout.py) is measured at most this often, and at the last step.
HELDOUT_EVERY_S = 60.0


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SPEC, description=__doc__.splitlines()[0],
                       target_help="the target's Hugging Face checkpoint directory")


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def lr_lambda(total: int, warmup: int, min_ratio: float):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(1, total - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return f


def main(argv=None) -> int:
    """The program's exit code: bad input is 2 with its `error:` line (ops/common.run_main)."""
    return run_main(_main, argv, prog=None)


def _main(argv=None) -> int:
    from ops.drafter import checkpoint as ck
    from ops.drafter import diskio
    from ops.drafter.data import DataError

    args = parse_args(argv)
    # However training leaves (the end, an error's return, an exception), the
    # prefetcher's thread is stopped and joined, the loader's workers released.
    with contextlib.ExitStack() as cleanup:
        try:
            return train(args, cleanup)
        except OSError as exc:
            if not diskio.is_disk_full(exc):
                raise
            # A full disk (a checkpoint, metrics.jsonl): the file and ENOSPC in one
            # line, as extract ends; the torn checkpoint is gone, the whole ones stay.
            newest = ck.newest(Path(args.output))
            raise BadInput(f"{diskio.disk_full_text(exc, args.output)}; "
                           + (f"the checkpoints written before stay (newest {newest}); free space and run "
                              f"again with resume=true" if newest
                              else "no checkpoint was written; free space and run again")) from None
        except DataError as exc:
            # A sample file that read_data's header check passed but that cannot
            # be read when its batch comes (truncated, overwritten since): the
            # file's name and exit 2, as for bad data found at the start; the
            # checkpoints written so far stay.
            from ops.drafter.data import FormatError
            from ops.hidden_formats import BadFormat

            raise (BadFormat if isinstance(exc, FormatError) else BadInput)(_data_error_line(exc)) from None


def _data_error_line(exc: Exception) -> str:
    """The error's own line: raised in a DataLoader worker, its text is the
    worker's whole traceback ("Caught DataError in DataLoader worker process 0.
    Original Traceback ..."), ending in the line raised there."""
    last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
    prefix = f"{type(exc).__module__}.{type(exc).__qualname__}: "
    return last[len(prefix):] if last.startswith(prefix) else last


def train(args: argparse.Namespace, cleanup: contextlib.ExitStack) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from ops.common import progress
    from ops.drafter import checkpoint as ck
    from ops.drafter import diskio
    from ops.drafter.config import from_target
    from ops.drafter.data import BatchDataset, holdout_split, make_batches, read_data
    from ops.drafter.metrics import simulated_acceptance_length
    from ops.drafter.model import Eagle3Drafter
    from ops.drafter.target_head import load_target_head
    from ops.drafter.vocab import load_vocab

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    is_main = rank == 0

    def log(msg: str) -> None:
        if is_main:
            print(msg, flush=True)

    output = Path(args.output)
    from ops.train.owner import OwnerError, begin, load_resumed, refuse_early
    from ops.train.report import ReportError, open_report
    try:
        refuse_early(output, args.resume, args.replace_checkpoints)
        report = open_report(args.report_to, output, write=is_main)
    except (ReportError, OwnerError) as exc:
        raise BadInput(str(exc)) from None
    try:
        info = read_data(Path(args.data))
        head = load_target_head(Path(args.target))
        vocab = load_vocab(Path(args.vocab), target_vocab_size=head.lm_head.shape[0])
        cfg = from_target(Path(args.target), vocab.size, info.layer_ids,
                          {"num_attention_heads": args.num_heads, "num_key_value_heads": args.num_kv_heads,
                           "intermediate_size": args.intermediate_size})
    except (ValueError, OSError) as exc:
        from ops.drafter.data import FormatError
        from ops.hidden_formats import BadFormat

        raise (BadFormat if isinstance(exc, FormatError) else BadInput)(str(exc)) from None
    if info.hidden_size != cfg.hidden_size:
        raise BadInput(f"{info.root / 'data_config.json'}: hidden_size {info.hidden_size} != the target's "
                       f"{cfg.hidden_size} ({args.target}/config.json)")

    torch.manual_seed(args.seed)
    model = Eagle3Drafter(cfg)
    model.init_from_target(head.lm_head, vocab.d2t, vocab.t2d)
    levers = resolve(use_cuda, args.ttt_attention, args.loss, args.fused_adamw, args.compile, args.length_bucket)
    model.ttt_attention, model.loss, model.compile_step = levers.ttt_attention, levers.loss, levers.compile
    model.to(device)
    dtype = torch.bfloat16 if use_cuda else torch.float32
    view = TargetView(head, vocab, device, dtype, info.final_post_norm)
    del head

    train_ids, held = holdout_split(sorted(info.samples), args.holdout, args.seed)
    batches = make_batches({i: info.lengths[i] for i in train_ids}, args.token_budget, args.max_len,
                           levers.length_bucket)
    dataset = BatchDataset(info, batches, args.max_len, levers.length_bucket, args.token_budget)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    per_epoch = len(sampler)                 # micro-batches per rank per epoch
    steps_per_epoch = per_epoch // args.grad_accum
    if steps_per_epoch == 0:
        raise BadInput(f"{len(batches)} batches cannot feed {world} rank(s) x {args.grad_accum} "
                       f"accumulation; lower --token-budget or --grad-accum")
    total = args.max_steps or args.epochs * steps_per_epoch
    warmup = math.ceil(total * args.warmup_ratio)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            **({"fused": True} if levers.fused_adamw else {}))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total, warmup, args.min_lr_ratio))

    meta_base = {"drafter_config": cfg.to_dict(), "target": str(Path(args.target).resolve()),
                 "data": str(Path(args.data).resolve()), "vocab": str(Path(args.vocab).resolve()),
                 "holdout": held, "world_size": world, "grad_accum": args.grad_accum,
                 "ttt_steps": args.ttt_steps, "total_steps": total}
    try:
        start = begin(output, args.resume, args.replace_checkpoints, cfg.to_dict(), is_main, log)
    except OwnerError as exc:
        raise BadInput(str(exc)) from None
    step = load_resumed(start, model, opt, sched, device)

    ddp = DDP(model, device_ids=[local_rank] if use_cuda else None, broadcast_buffers=False) \
        if world > 1 else model

    if is_main:
        output.mkdir(parents=True, exist_ok=True)
        with diskio.naming(output / "train_config.json"):
            (output / "train_config.json").write_text(
                json.dumps(dict(meta_base, run=start.run.to_dict(), args=vars(args)), indent=1))

    def stream(consumed: int):
        """Micro-batches from position `consumed` (per rank) onwards, across epochs."""
        epoch, skip = divmod(consumed, per_epoch)
        while True:
            sampler.set_epoch(epoch)
            order = list(iter(sampler))[skip:]
            # No pin_memory: its thread copies each batch (534 MB at 8 x 2,048 tokens of
            # an 8B target) once more in this process, and on an H200 the GPU then idled
            # 9.7-12 % of a step for data; the copy straight from the workers' shared
            # memory left 3.5 %, while it and next(loader) ran in the training thread
            # (benchmarks/RESULTS.md, train_throughput). Both now run in the
            # prefetcher's own thread (ops/train/prefetch.py), which iterates this.
            loader = DataLoader(dataset, batch_size=None, sampler=order, num_workers=args.workers,
                                pin_memory=False, persistent_workers=False)
            for batch in loader:
                yield epoch, batch
            epoch, skip = epoch + 1, 0

    from ops.train.heldout import HeldOut
    heldout = HeldOut(info, held if is_main else [], args.token_budget, args.max_len, levers.length_bucket)
    ho, ho_t, ho_step = None, None, 0

    from ops.train.prefetch import DevicePrefetcher
    it = DevicePrefetcher((dict(batch, epoch=e) for e, batch in stream(step * args.grad_accum)), device, dtype,
                          fmt=info.format, hidden=info.hidden_size)
    cleanup.callback(it.close)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if use_cuda else contextlib.nullcontext()
    log(f"train: {len(info.samples)} samples ({len(train_ids)} train, {len(held)} held out), "
        f"{len(batches)} batches, {world} rank(s) x accum {args.grad_accum}, {total} steps, "
        f"ttt {args.ttt_steps}, device {device}; {levers.describe()}")
    # One line per refresh (not tqdm's carriage returns): the log is a file
    # that other lines are printed into between refreshes.
    bar = progress(total=total, initial=step, disable=not is_main, desc="train", unit="step", mininterval=2.0)
    metrics_path = output / "metrics.jsonl"
    window_tokens, window_t0 = 0, time.monotonic()
    epoch = step * args.grad_accum // per_epoch
    exit_code = 0
    while step < total:
        model.train()
        sums = torch.zeros(3 * args.ttt_steps + 2, device=device)   # loss_k, correct_k, count_k, loss, tokens
        for micro in range(args.grad_accum):
            batch, dev = it.next()
            epoch = batch["epoch"]
            bad = out_of_vocab(batch, info, view.embed.shape[0], args.target)
            if bad:
                # Checked on the CPU copy: on the device the embedding lookup is
                # a bare IndexError (a device-side assert on CUDA) naming nothing.
                raise BadInput(bad)
            tgt, ok = view.targets(dev["final"], dev["loss_mask"], dev["lengths"])
            sync = contextlib.nullcontext() if (world == 1 or micro == args.grad_accum - 1) else ddp.no_sync()
            with sync, autocast:
                loss, losses, correct, counts = ddp(dev["input_ids"], dev["aux"], view.embed, tgt, ok,
                                                    args.ttt_steps, args.decay)
                (loss / args.grad_accum).backward()
            k = args.ttt_steps
            sums[:k] += losses / args.grad_accum
            sums[k:2 * k] += correct
            sums[2 * k:3 * k] += counts
            sums[3 * k] += loss.detach() / args.grad_accum
            sums[3 * k + 1] += batch["lengths"].sum()
        if not math.isfinite(float(sums[3 * args.ttt_steps])):
            print(f"error: loss is not finite at step {step + 1}", file=sys.stderr, flush=True)
            exit_code = 3
            break
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if world > 1:
            dist.all_reduce(sums)
            sums[:args.ttt_steps] /= world
            sums[3 * args.ttt_steps] /= world
        k = args.ttt_steps
        window_tokens += int(sums[3 * k + 1])
        bar.update(1)
        if step % args.log_every == 0 or step == total:
            elapsed = max(1e-9, time.monotonic() - window_t0)
            acc = (sums[k:2 * k] / sums[2 * k:3 * k].clamp(min=1)).tolist()
            # At most once a HELDOUT_EVERY_S (and at the end): on a real job's holdout the walk
            # costs seconds, and a window is logged every few steps.
            if step == total or ho_t is None or time.monotonic() - ho_t >= HELDOUT_EVERY_S:
                with autocast:
                    ho = heldout.measure(model, view, k, device, dtype)
                ho_t, ho_step = time.monotonic(), step
            rec = {"step": step, "total": total, "epoch": epoch, "loss": float(sums[3 * k]),
                   "step_loss": [round(float(x), 5) for x in sums[:k]],
                   "acc": [round(a, 4) for a in acc], "counted": [int(c) for c in sums[2 * k:3 * k]],
                   "simulated_acceptance_length": round(ho["acceptance_length"] if ho
                                                        else simulated_acceptance_length(acc), 4),
                   "tok_s": window_tokens / elapsed, "lr": sched.get_last_lr()[0],
                   "grad_norm": float(grad_norm)}
            if ho:
                rec["heldout"] = {"step": ho_step, "tokens": ho["tokens"], "verifies": ho["verifies"],
                                  "by_depth": [round(a, 4) for a in ho["by_depth"]],
                                  "acc": [round(a, 4) for a in ho["acc"]]}
            if is_main:
                print(f"progress: step {step}/{total} loss {rec['loss']:.4f} "
                      f"acc [{','.join(f'{a:.3f}' for a in acc)}] tok/s {rec['tok_s']:.0f} "
                      f"lr {rec['lr']:.3e} epoch {epoch}", flush=True)
                with diskio.naming(metrics_path), open(metrics_path, "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                if report is not None:
                    report.log(rec)
            window_tokens, window_t0 = 0, time.monotonic()
        stopping = step == args.stop_at
        if step % args.save_every == 0 or step == total or stopping:
            if is_main:
                path = ck.save(output, step, model.trainable_state(),
                               {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()},
                               dict(meta_base, loss=float(sums[3 * k])), args.keep, start.run, start.own)
                print(f"checkpoint: {path}", flush=True)
            if world > 1:
                dist.barrier()
        if stopping:
            log(f"stop-at: leaving after step {step} of {total}")
            break
    bar.close()
    if report is not None:
        report.close()
    if exit_code == 0:
        log(f"done: {step} steps; newest checkpoint {ck.newest(output)}")
    if world > 1:
        dist.destroy_process_group()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
