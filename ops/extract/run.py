"""An extraction run: prepare's samples in, the hidden-state layout out.

Data flow: samples.py (prepare's output) -> loop.py (this rank's batches:
batching.py's plan, capture.py's forward with hooks, file images in pinned
slabs, writer.py's threads) -> output.py (data_config, sample_lengths);
progress.py prints what the log monitor parses. Under torchrun rank r takes samples r::WORLD_SIZE; rank 0
owns data_config.json and sample_lengths.json. Imported by __main__.main()
only, so torch stays out of the spec's imports. With engine "sglang",
sglang_run.py enters at extract(): its loop is a _Loop whose forward is
SGLang's, rank 0 the whole data world, the other TP ranks its followers.

Resume: a sample file on disk counts as done only when verify's header
check (ops/verify/check.py check_files: header whole, file as long as it
says, shapes and token count right) passes; the others are rewritten, and
the log says how many and why. A full disk (ENOSPC/EDQUOT) stops the loop
and ends the run with one line naming the path, data_config.json saying
"incomplete" and why.
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
import sys
import time
from pathlib import Path

import torch

from ops.common import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, BadInput
from ops.extract import output, preflight, target as target_mod
from ops.units import human_bytes
from ops.extract.loop import _Loop, log
from ops.extract.samples import load_samples
from ops.extract.writer import DISK_FULL
from ops.formats import DATA_CONFIG, SAMPLE_RE, SHARD_ROWS, TMP_SUFFIX, sample_path
from ops.layers import engine_ids, parse_layer_ids


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _distributed() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local


def extract(args) -> int:
    """Extract, and on a full disk end with one line and an `incomplete` data_config, not a traceback."""
    known: dict = {}
    try:
        if getattr(args, "engine", "hf") == "sglang":
            # The SGLang engine's dispatch: rank 0 runs this loop as a world of
            # one over a target SGLang holds, the other TP ranks follow it.
            from ops.extract import sglang_run
            return sglang_run.extract(args, lambda: _extract(args, known, sglang_run))
        return _extract(args, known)
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            _not_running(known, exc)
            raise
        return _disk_full(known, exc)
    except BaseException as exc:
        _not_running(known, exc)
        raise


def _not_running(known: dict, exc: BaseException) -> None:
    """A run that ends by an exception (a target that does not load, a
    keyboard interrupt) must not leave data_config.json saying "running"."""
    config, out_dir = known.get("config"), known.get("out_dir")
    if not known.get("config_written") or config is None or config.get("status") != "running":
        return
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        return
    why = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    config.update(status="incomplete", incomplete_reason=why[:500])
    output.rewrite_data_config(out_dir, config)


def _disk_full(known: dict, exc: OSError) -> int:
    name = errno.errorcode.get(exc.errno, str(exc.errno))
    where = exc.filename or known.get("out_dir", "the output")
    why = f"disk full: {where}: {exc.strerror} ({name})"
    rank = _distributed()[0]
    config, out_dir = known.get("config"), known.get("out_dir")
    count, note = "", ""
    if rank == 0 and config is not None and out_dir is not None and (out_dir / DATA_CONFIG).exists():
        total = config["total_samples"]
        on_disk = len(output.scan_existing(out_dir)[0] & set(range(total)))
        count = f"; {on_disk} of {total} samples on disk"
        config.update(status="incomplete", incomplete_reason=why, missing_samples=total - on_disk)
        if not output.rewrite_data_config(out_dir, config):
            note = f"; {out_dir / DATA_CONFIG} could not be updated either"
    print(f"extract: error: {where}: {exc.strerror} ({name}){count}; free space and run again to resume{note}",
          file=sys.stderr, flush=True)
    return EXIT_FAILURE


def _extract(args, known: dict, engine=None) -> int:
    rank, world, local_rank = engine.data_coords() if engine else _distributed()
    out_dir = Path(args.output)
    known["out_dir"] = out_dir
    info = target_mod.read_target(Path(args.target))
    samples = load_samples(Path(args.input), max_seq_len=args.max_seq_len, limit=args.num_samples)
    try:
        layer_ids = parse_layer_ids(args.layer_ids, info.num_layers)
    except ValueError as exc:
        raise BadInput(f"target {info.path}: {exc}") from exc
    dtype = target_mod.resolve_dtype(args.dtype, info)
    if args.token_budget <= 0:
        raise BadInput(f"token_budget must be positive, got {args.token_budget}")
    for name in ("writers", "queue_size", "host_batches"):
        if getattr(args, name) < 1:
            raise BadInput(f"{name} must be at least 1, got {getattr(args, name)}")
    lengths = samples.lengths()
    total_samples, total_tokens = len(lengths), sum(lengths)

    arch = info.architecture or info.model_type
    config = {
        "status": "running",
        "data_format_version": output.DATA_FORMAT_VERSION,
        "extraction_method": "hf_transformers_forward_hooks",
        "target": str(info.path.absolute()),
        "target_architecture": info.architecture,
        "target_model_type": info.model_type,
        "num_hidden_layers": info.num_layers,
        **engine_ids(layer_ids, info.num_layers, arch),
        "final_hidden_state": "post_norm",
        "hidden_size": info.hidden_size,
        "aux_hidden_size": info.hidden_size * len(layer_ids),
        "dtype": dtype,
        "max_seq_len": args.max_seq_len,
        "total_samples": total_samples,
        "total_tokens": total_tokens,
        "shard_rows": SHARD_ROWS,
        "input": str(Path(args.input).absolute()),
        "token_budget": args.token_budget,
        "compiled_layers": bool(getattr(args, "compile", False)),
        "world_size": world,
        "command": [sys.executable, "-m", "ops.extract", *args.argv],
        "versions": output.package_versions(),
        "started_at": _now(),
    }
    if engine:
        config.update(engine.config_keys(args, args.sglang_version))
    output.check_resumable(out_dir, config)
    known["config"] = config

    done, tmps = output.scan_existing(out_dir)
    for tmp in tmps:
        m = SAMPLE_RE.match(tmp.name[: -len(TMP_SUFFIX)])
        owner = int(m.group(1)) % world if m else 0
        if owner == rank:
            tmp.unlink(missing_ok=True)
    done &= set(range(total_samples))
    # A file that exists was whole when renamed, but a disk, a copy or a hand
    # can cut it since: verify's header check (cheap: headers only) decides
    # what counts as done; the owner rank deletes the bad ones to rewrite them.
    rewrite = _check_existing(out_dir, config, done, lengths)
    done -= set(rewrite)
    for idx in rewrite:
        if idx % world == rank:
            sample_path(out_dir, idx).unlink(missing_ok=True)
    remaining = sum(n for i, n in enumerate(lengths) if i not in done)

    params = {"input": args.input, "layer_ids": layer_ids, "dtype": dtype,
              "tokens": args.tokens or total_tokens}
    fits, disk_text = preflight.disk_check(
        params, {"hidden_size": info.hidden_size, "dtype": dtype}, out_dir,
        remaining / total_tokens if total_tokens else 0.0)
    if rank == 0:
        log(f"extract: {total_samples} samples, {total_tokens} tokens; aux layers {layer_ids} "
            f"(HF hidden_states {config['hf_hidden_states_indices']}, SGLang capture "
            f"{config['sglang_layers_to_capture']}) + final post-norm; {len(done)} already on disk")
        if rewrite:
            shown = "; ".join(f"{sample_path(out_dir, i).name}: {why}" for i, why in list(rewrite.items())[:10])
            log(f"extract: resume: rewriting {len(rewrite)} sample file(s) on disk that fail verify's header "
                f"check: {shown}" + (" ..." if len(rewrite) > 10 else ""))
        log(disk_text)
    if not fits:
        if not args.force:
            if rank == 0:
                print(f"extract: refusing to start: not enough free disk space ({disk_text}). "
                      f"Free space, choose another output, or pass --force.", file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        if rank == 0:
            log("extract: --force: starting although the estimate exceeds the free space")

    if world > 1:
        import torch.distributed as dist
        dist.init_process_group(backend="gloo", timeout=_dt.timedelta(hours=24))
    placement = target_mod.choose_placement(args.device, info, world, local_rank)
    if args.memory_fraction is not None:
        target_mod.cap_memory(placement, args.memory_fraction)

    if rank == 0:
        output.write_data_config(out_dir, config)
        known["config_written"] = True
        output.write_sample_lengths(out_dir, dict(enumerate(lengths)))
    _barrier(world)

    mine = [i for i in range(total_samples) if i % world == rank]
    if all(i in done for i in mine):
        # A re-run over a finished share must not pay for the model load.
        log("extract: every sample of this share is on disk; nothing to extract"
            + (f" [rank {rank}/{world}]" if world > 1 else ""))
        stats = {"new_samples": 0, "new_tokens": 0, "errors": 0, "elapsed": 0.0}
    elif engine:
        loop = engine.leader_loop(info, dtype, layer_ids, samples, lengths, out_dir, done, args)
        stats = loop.run(mine)
    else:
        log(f"loading target {info.path} ({human_bytes(info.weight_bytes)}, {dtype}) "
            f"on {placement.describe()}" + (f" [rank {rank}/{world}]" if world > 1 else ""))
        t0 = time.monotonic()
        model = target_mod.load_model(info, dtype, placement)
        log(f"target loaded in {(time.monotonic() - t0) / 60:.1f} minutes")
        if args.compile:
            from ops.extract.capture import compile_layers
            log(f"compile: {compile_layers(model)} decoder layers compiled (torch.compile, one shared graph; "
                f"the first batches pay the compile)")
        loop = _Loop(model, layer_ids, samples, lengths, out_dir, done, args, rank, world)
        stats = loop.run(mine)

    disk_full = stats.get("disk_full")
    totals = [stats["new_samples"], stats["new_tokens"], stats["errors"], int(disk_full is not None)]
    elapsed = stats["elapsed"]
    if world > 1:
        import torch.distributed as dist

        t = torch.tensor(totals, dtype=torch.float64)
        dist.all_reduce(t)
        e = torch.tensor([elapsed], dtype=torch.float64)
        dist.all_reduce(e, op=dist.ReduceOp.MAX)
        totals, elapsed = [int(v) for v in t.tolist()], float(e.item())
    new_samples, new_tokens, errors, full_ranks = totals
    code = EXIT_OK
    if full_ranks and world == 1:
        raise disk_full     # extract() ends it with one line and an incomplete data_config
    if rank == 0:
        on_disk, _ = output.scan_existing(out_dir)
        missing = sorted(set(range(total_samples)) - on_disk)
        minutes = elapsed / 60
        log(f"{new_samples} samples, {new_tokens} tokens extracted in {minutes:.1f} minutes. "
            f"{new_samples / max(elapsed, 1e-9):.1f} samples/s, {new_tokens / max(elapsed, 1e-9):.0f} tok/s."
            + (f" ({len(done)} samples were already on disk.)" if done else ""))
        if missing or errors:
            config["status"] = "incomplete"
            config["missing_samples"] = len(missing)
            config["errors"] = errors
            if full_ranks:
                config["incomplete_reason"] = f"disk full: {full_ranks} rank(s) got ENOSPC writing to {out_dir}"
            output.write_data_config(out_dir, config)
            print(f"extract: incomplete: {len(missing)} samples missing (first: {missing[:10]}), "
                  f"{errors} write errors; run again to resume", file=sys.stderr, flush=True)
            code = EXIT_FAILURE
        else:
            config["status"] = "complete"
            config["completed_at"] = _now()
            output.write_data_config(out_dir, config)
            log(f"extract: complete: {total_samples} samples, {total_tokens} tokens in {out_dir}")
    if world > 1:
        _barrier(world)
        import torch.distributed as dist
        dist.destroy_process_group()
    return code


def _check_existing(out_dir: Path, config: dict, done: set[int], lengths: list[int]) -> dict[int, str]:
    """idx -> why, for the sample files on disk that verify's header check finds bad."""
    from ops.verify.check import check_files, expected_from

    paths = {i: str(sample_path(out_dir, i)) for i in done}
    return {idx: reason for idx, _path, _tokens, reason in
            check_files(paths, expected_from(config), dict(enumerate(lengths))) if reason is not None}


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist
        dist.barrier()
