"""An extraction run: prepare's samples in, the hidden-state layout out.

Data flow: ops/prepared.py (prepare's output) -> loop.py (this rank's batches:
batching.py's plan, the engine's forward, file images in pinned slabs,
writer.py's threads) -> output.py (data_config, sample_lengths); progress.py
prints what the log monitor parses. The engine (engine.py's Engine: HF or
SGLang, opened by __main__) says where this process is in the data world,
loads the target and runs its forward; nothing here asks which engine it is.
Under torchrun with the HF engine rank r takes samples r::WORLD_SIZE; with
SGLang rank 0 is the whole data world and the other TP ranks follow it.
Rank 0 owns data_config.json and sample_lengths.json. Imported by
__main__.main() only, so torch stays out of the spec's imports.

Resume: a sample file on disk counts as done only when verify's header
check (ops/sample_check.py check_files: header whole, file as long as it
says, shapes and token count right) passes; the others are rewritten, and
the log says how many and why. A full disk (ENOSPC/EDQUOT) stops the loop
and ends the run with one line naming the path, data_config.json saying
"incomplete" and why.
"""

from __future__ import annotations

import datetime as _dt
import errno
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ops.common import DISK_FULL, EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, TMP_SUFFIX, BadInput, torchrun_coords
from ops.extract import output, preflight
from ops.target_model import model as target_mod
from ops.extract.engine import Engine
from ops.extract.loop import Loop, log
from ops.prepared import load_samples
from ops.formats import DATA_CONFIG, SAMPLE_RE, SHARD_ROWS, sample_path
from ops import hidden_formats
from ops.layers import engine_ids, parse_layer_ids


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def extract(args, engine: Engine, argv: list[str]) -> int:
    """Extract, and on a full disk end with one line and an `incomplete` data_config, not a traceback."""
    known: dict = {}
    try:
        if not engine.leads():
            return engine.follow()
        try:
            return _extract(args, engine, argv, known)
        finally:
            engine.close()
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
    rank = torchrun_coords()[0]
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


@dataclass
class _Run:
    """One leader's run: what the steps of _extract share."""

    args: object
    out_dir: Path
    info: target_mod.TargetInfo
    samples: object
    lengths: list[int]
    layer_ids: list[int]
    dtype: str
    config: dict
    rank: int
    world: int
    local_rank: int
    done: set[int] = field(default_factory=set)


def _extract(args, engine: Engine, argv: list[str], known: dict) -> int:
    run = _open_run(args, engine, argv, known)
    if getattr(args, "spool_bytes", None):
        # The producer of a spool: the consumer's plan and a byte cap decide what is extracted
        # and when (ops/extract/spool_producer.py); no disk preflight of the whole extraction.
        from ops.extract.spool_producer import produce

        return produce(run, engine, lambda: _place(run))
    rewrite = _resume(run)
    if not _preflight(run, rewrite):
        return EXIT_BAD_INPUT
    placement = _start(run, known)
    mine = [i for i in range(len(run.lengths)) if i % run.world == run.rank]
    if all(i in run.done for i in mine):
        # A re-run over a finished share must not pay for the model load.
        log("extract: every sample of this share is on disk; nothing to extract"
            + (f" [rank {run.rank}/{run.world}]" if run.world > 1 else ""))
        stats = {"new_samples": 0, "new_tokens": 0, "errors": 0, "elapsed": 0.0}
    else:
        target = engine.load(run.info, run.dtype, run.layer_ids, placement)
        stats = Loop(target, run.samples, run.lengths, run.out_dir, run.done, args, run.rank, run.world).run(mine)
    return _finish(run, stats)


def _open_run(args, engine: Engine, argv: list[str], known: dict) -> _Run:
    """The target's config, the samples, the params checked, data_config.json's
    contents (checked against a previous run's in the same output)."""
    rank, world, local_rank = engine.coords()
    out_dir = Path(args.output)
    known["out_dir"] = out_dir
    info = target_mod.read_target(Path(args.target))
    samples = load_samples(Path(args.input), max_seq_len=args.max_seq_len, limit=args.num_samples)
    try:
        layer_ids = parse_layer_ids(args.layer_ids, info.num_layers)
    except ValueError as exc:
        raise BadInput(f"target {info.path}: {exc}") from exc
    dtype = target_mod.resolve_dtype(args.dtype, info)
    fmt = hidden_formats.check_name(getattr(args, "format", hidden_formats.DEFAULT), "--format")
    problem = hidden_formats.width_problem(fmt, info.hidden_size)
    if problem:
        raise hidden_formats.BadFormat(f"target {info.path}: {problem}; choose another format")
    lengths = samples.lengths()
    config = _data_config(args, argv, info, layer_ids, dtype, lengths, world)
    config.update(engine.config_keys())
    output.check_resumable(out_dir, config)
    known["config"] = config
    return _Run(args, out_dir, info, samples, lengths, layer_ids, dtype, config, rank, world, local_rank)


def _data_config(args, argv, info, layer_ids, dtype, lengths, world) -> dict:
    arch = info.architecture or info.model_type
    return {
        "status": "running",
        "data_format_version": output.DATA_FORMAT_VERSION,
        "extraction_method": None,      # the engine's (config_keys)
        "target": str(info.path.absolute()),
        "target_architecture": info.architecture,
        "target_model_type": info.model_type,
        "num_hidden_layers": info.num_layers,
        **engine_ids(layer_ids, info.num_layers, arch),
        "final_hidden_state": "post_norm",
        "hidden_size": info.hidden_size,
        "aux_hidden_size": info.hidden_size * len(layer_ids),
        "dtype": dtype,
        "format": getattr(args, "format", hidden_formats.DEFAULT),
        "format_params": hidden_formats.format_params(getattr(args, "format", hidden_formats.DEFAULT),
                                                      info.hidden_size),
        "max_seq_len": args.max_seq_len,
        "total_samples": len(lengths),
        "total_tokens": sum(lengths),
        "shard_rows": SHARD_ROWS,
        "input": str(Path(args.input).absolute()),
        "token_budget": args.token_budget,
        "compiled_layers": bool(getattr(args, "compile", False)),
        "world_size": world,
        "command": [sys.executable, "-m", "ops.extract", *argv],
        "versions": output.package_versions(),
        "started_at": _now(),
    }


def _resume(run: _Run) -> dict[int, str]:
    """run.done: the samples on disk that pass verify's header check; the
    others (idx -> why) are deleted by their owner rank to be rewritten."""
    out_dir, world, rank, total = run.out_dir, run.world, run.rank, len(run.lengths)
    done, tmps = output.scan_existing(out_dir)
    for tmp in tmps:
        m = SAMPLE_RE.match(tmp.name[: -len(TMP_SUFFIX)])
        owner = int(m.group(1)) % world if m else 0
        if owner == rank:
            tmp.unlink(missing_ok=True)
    done &= set(range(total))
    # A file that exists was whole when renamed, but a disk, a copy or a hand
    # can cut it since: verify's header check (cheap: headers only) decides
    # what counts as done; the owner rank deletes the bad ones to rewrite them.
    rewrite = _check_existing(out_dir, run.config, done, run.lengths)
    done -= set(rewrite)
    for idx in rewrite:
        if idx % world == rank:
            sample_path(out_dir, idx).unlink(missing_ok=True)
    run.done = done
    return rewrite


def _preflight(run: _Run, rewrite: dict[int, str]) -> bool:
    """The disk estimate of what is left against the free space; False: refused."""
    args, config, out_dir, lengths = run.args, run.config, run.out_dir, run.lengths
    total_samples, total_tokens = len(lengths), sum(lengths)
    remaining = sum(n for i, n in enumerate(lengths) if i not in run.done)
    params = {"input": args.input, "layer_ids": run.layer_ids, "dtype": run.dtype,
              "format": config["format"], "tokens": args.tokens or total_tokens}
    fits, disk_text = preflight.disk_check(
        params, {"hidden_size": run.info.hidden_size, "dtype": run.dtype}, out_dir,
        remaining / total_tokens if total_tokens else 0.0)
    if run.rank == 0:
        log(f"extract: {total_samples} samples, {total_tokens} tokens; aux layers {run.layer_ids} "
            f"(HF hidden_states {config['hf_hidden_states_indices']}, SGLang capture "
            f"{config['sglang_layers_to_capture']}) + final post-norm; {len(run.done)} already on disk; format "
            f"{hidden_formats.describe(config['format'], run.dtype)}")
        if rewrite:
            shown = "; ".join(f"{sample_path(out_dir, i).name}: {why}" for i, why in list(rewrite.items())[:10])
            log(f"extract: resume: rewriting {len(rewrite)} sample file(s) on disk that fail verify's header "
                f"check: {shown}" + (" ..." if len(rewrite) > 10 else ""))
        log(disk_text)
    if not fits:
        if not args.force:
            if run.rank == 0:
                print(f"extract: refusing to start: not enough free disk space ({disk_text}). "
                      f"Free space, choose another output, or pass --force.", file=sys.stderr, flush=True)
            return False
        if run.rank == 0:
            log("extract: --force: starting although the estimate exceeds the free space")
    return True


def _start(run: _Run, known: dict) -> target_mod.Placement:
    """The ranks' group, this rank's placement, data_config.json "running"."""
    if run.world > 1:
        import torch.distributed as dist
        dist.init_process_group(backend="gloo", timeout=_dt.timedelta(hours=24))
    placement = target_mod.choose_placement(run.args.device, run.info, run.world, run.local_rank)
    if run.args.memory_fraction is not None:
        target_mod.cap_memory(placement, run.args.memory_fraction)
    if run.rank == 0:
        output.write_data_config(run.out_dir, run.config)
        known["config_written"] = True
        output.write_sample_lengths(run.out_dir, dict(enumerate(run.lengths)))
    _barrier(run.world)
    return placement


def _place(run: _Run) -> target_mod.Placement:
    """This process's placement of the target, its memory cap applied (a spool's producer: one process)."""
    placement = target_mod.choose_placement(run.args.device, run.info, run.world, run.local_rank)
    if run.args.memory_fraction is not None:
        target_mod.cap_memory(placement, run.args.memory_fraction)
    return placement


def _finish(run: _Run, stats: dict) -> int:
    """Every rank's counts summed; rank 0 writes data_config.json complete or incomplete."""
    out_dir, config, world = run.out_dir, run.config, run.world
    total_samples, total_tokens = len(run.lengths), sum(run.lengths)
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
    if run.rank == 0:
        on_disk, _ = output.scan_existing(out_dir)
        missing = sorted(set(range(total_samples)) - on_disk)
        minutes = elapsed / 60
        log(f"{new_samples} samples, {new_tokens} tokens extracted in {minutes:.1f} minutes. "
            f"{new_samples / max(elapsed, 1e-9):.1f} samples/s, {new_tokens / max(elapsed, 1e-9):.0f} tok/s."
            + (f" ({len(run.done)} samples were already on disk.)" if run.done else ""))
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
    """idx -> why, for the sample files on disk that verify's header check finds bad.
    A file in another format than the run's is no damage to repair but a mix
    of runs: refused (BadFormat), nothing deleted."""
    from ops.sample_check import FORMAT_MISMATCH, check_files, expected_from

    paths = {i: str(sample_path(out_dir, i)) for i in done}
    bad = {idx: (path, reason) for idx, path, _tokens, reason in
           check_files(paths, expected_from(config), dict(enumerate(lengths))) if reason is not None}
    for idx, (path, reason) in bad.items():
        if reason.startswith(FORMAT_MISMATCH):
            raise hidden_formats.BadFormat(f"{path}: {reason}; a run keeps one format: resume with the "
                                           f"output's format or use another output (nothing was rewritten)")
    return {idx: reason for idx, (_path, reason) in bad.items()}


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist
        dist.barrier()
