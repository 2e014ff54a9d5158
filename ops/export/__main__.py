"""python -m ops.export: write a trained drafter for SGLang and for speculators/vLLM.

Data flow: train's checkpoint (newest under --checkpoint, or the one named) ->
<output>/sglang/{config.json, model.safetensors} and
<output>/speculators/{config.json, model.safetensors (with the target's
embed_tokens.weight), verifier/ (what speculators reads of the target:
ops/export/verifier.py)}, plus <output>/export_info.json (layer ids in every
convention, source step, the --check result). bench reads either directory
back. Formats and the loader code they were checked against:
ops/drafter/formats.py. The whole output is built beside the old one and
switched in at once (ops/export/switch.py); a full disk ends in one line
naming the file, the old export unchanged.

--check reloads what was written (shapes against config.json, the aux ids back
through each engine's rule to the canonical ids) and compares the reloaded
drafter's logits with the training checkpoint's over a few samples and all
draft steps.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from ops.common import BadInput, run_main, wants_cuda
from ops.params import build_parser as spec_parser
from ops.export.spec import SPEC

# Relative logit error allowed after casting the weights (fp32 must round-trip exactly).
CHECK_TOL = {"float32": 1e-5, "bfloat16": 3e-2, "float16": 5e-3}
MIN_TOP1_AGREEMENT = 0.97


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SPEC, description=__doc__.splitlines()[0], target_required=False,
                       target_help="the target's checkpoint (default: the one training used)")


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def write_format(stage: Path, fmt: str, config: dict, state: dict) -> Path:
    from ops.drafter import diskio

    final = stage / fmt
    final.mkdir(parents=True)
    diskio.write_text(final / "config.json", json.dumps(config, indent=2) + "\n")
    diskio.save_safetensors(state, final / "model.safetensors", metadata={"format": "pt"})
    return final


def target_head(candidates: list[str], cfg):
    """(the local target's folder, its head) for the speculators format: speculators'
    Eagle3DraftModel (0.9.0) takes embed_tokens.weight from the export and
    fills it from the verifier only where its freshly allocated tensor holds
    NaN, so without it the logits depend on the allocator."""
    from ops.drafter.target_head import load_target_head

    local = [c for c in candidates if c and Path(c).is_dir()]
    if not local:
        raise ValueError(f"the speculators format holds the target's embedding, and no local target checkpoint "
                         f"was found among {[c for c in candidates if c]}; pass --target DIR")
    head = load_target_head(Path(local[0]))
    if tuple(head.embed.shape) != (cfg.target_vocab_size, cfg.hidden_size):
        raise ValueError(f"{local[0]}: embedding of shape {tuple(head.embed.shape)}, the drafter was trained for "
                         f"[{cfg.target_vocab_size}, {cfg.hidden_size}]")
    return Path(local[0]), head


def _stored_inputs(data, idx: int):
    """(input_ids [1, T], aux [1, T, 3H] float32) of an extracted sample."""
    import torch

    from ops.drafter.data import collate, decode_batch, load_sample

    batch = collate([load_sample(data.samples[idx], data.hidden_size, 4096, data.format)])
    return batch["input_ids"], decode_batch(batch, data.format, data.hidden_size, torch.float32)["aux"]


def check(ref_model, written: dict[str, Path], meta: dict, args, target: Path) -> dict:
    import torch

    from ops.drafter.data import read_data
    from ops.drafter.target_head import load_target_head
    from ops.drafter.formats import read_export

    device = check_device(args.device)
    if args.data or meta.get("data"):
        data = read_data(Path(args.data or meta["data"]))
        ids = list(meta.get("holdout") or []) or sorted(data.samples)
        ids = ids[: args.check_samples]
        inputs = {idx: _stored_inputs(data, idx) for idx in ids}
    else:
        # An online (or streamed) run stored no states: the check's are the target's own,
        # computed here by the target model's forward (ops/target_model) on prepare's samples, as online
        # training computes them.
        from ops.target_model.forward import states_for

        if not meta.get("samples"):
            raise ValueError("the checkpoint names neither data (offline) nor samples (online); pass --data")
        ids = (list(meta.get("holdout") or []) or [0])[: args.check_samples]
        inputs = states_for(Path(meta["samples"]), target, meta.get("layer_ids") or ref_model.cfg.aux_layer_ids,
                            ids, device)
    embed = load_target_head(target).embed.float().to(device)
    steps = int(meta.get("ttt_steps", 3))
    ref_model.to(device).eval()
    report = {"samples": ids, "steps": steps, "formats": {}}
    for fmt, path in written.items():
        model, cfg, _, _ = read_export(path, ref_model.cfg.target_architecture)
        embed_ok = True
        if fmt == "speculators":
            from safetensors import safe_open

            # safe_open reads onto the CPU; the check's embedding is on its device.
            with safe_open(str(path / "model.safetensors"), framework="pt") as fh:
                embed_ok = torch.equal(fh.get_tensor("embed_tokens.weight").float(),
                                       embed.to(getattr(torch, args.dtype)).float().cpu())
        model.to(device).eval()
        ids_ok = cfg.aux_layer_ids == ref_model.cfg.aux_layer_ids
        worst, agree, total = 0.0, 0, 0
        with torch.no_grad():
            for idx in ids:
                input_ids, aux = (x.to(device) for x in inputs[idx])
                ref = [lg for _, lg in ref_model.unroll(input_ids, aux, embed, steps)]
                got = [lg for _, lg in model.unroll(input_ids, aux, embed, steps)]
                for a, b in zip(ref, got):
                    worst = max(worst, float((a - b).norm() / a.norm().clamp(min=1e-12)))
                    agree += int((a.argmax(-1) == b.argmax(-1)).sum())
                    total += a.shape[1]
        top1 = agree / max(1, total)
        ok = ids_ok and embed_ok and worst <= CHECK_TOL[args.dtype] and top1 >= MIN_TOP1_AGREEMENT
        report["formats"][fmt] = {"ok": ok, "aux_ids_roundtrip": ids_ok, "rel_logit_err": worst,
                                  "top1_agreement": top1, "positions": total,
                                  **({"embed_is_targets": embed_ok} if fmt == "speculators" else {})}
        print(f"check: {fmt}: rel logit error {worst:.2e} (tol {CHECK_TOL[args.dtype]:.0e}), top-1 agreement "
              f"{top1:.4f} over {total} positions ({len(ids)} samples, {steps} steps), aux ids "
              f"{'round-trip' if ids_ok else 'DO NOT round-trip: ' + str(cfg.aux_layer_ids)}"
              f"{'' if embed_ok else ', embed_tokens.weight is NOT the target embedding'} -> "
              f"{'ok' if ok else 'FAILED'}", flush=True)
    report["ok"] = all(f["ok"] for f in report["formats"].values())
    return report


def check_device(device: str) -> str:
    """Where the check computes: "cuda" or "cpu" (auto: CUDA when this machine has it)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available on this machine (auto or cpu runs the check here)")
    return "cuda" if wants_cuda(device) else "cpu"


def target_ref(value: str) -> str:
    """How the exported configs name the target: a local one as an absolute
    path (speculators takes a relative `verifier.name_or_path` for a Hub id
    when loaded from any other directory, and fails), a model id as given."""
    path = Path(value).expanduser()
    return str(path.resolve()) if value and path.exists() else value


def main(argv=None) -> int:
    """The program's exit code: bad input is 2 with its `error:` line (ops/common.run_main)."""
    return run_main(_main, argv, prog=None)


def _main(argv=None) -> int:
    args = parse_args(argv)
    from ops.drafter import checkpoint as ck
    from ops.drafter import diskio
    from ops.export import switch

    try:
        ckpt = ck.resolve(Path(args.checkpoint))
        model, meta = ck.load_drafter(ckpt)
        out = switch.real_output(Path(args.output))
        switch.recover(out, lambda msg: print(msg, flush=True))
        switch.check_output(out)
    except (ValueError, OSError) as exc:
        raise BadInput(str(exc)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = switch.staging_dir(out)
    try:
        return _export(args, ckpt, model, meta, out, stage)
    except OSError as exc:
        # A full disk, or a switch the filesystem refuses (an output that is a mount
        # point: EXDEV/EBUSY): one line; the old export is where it was.
        why = diskio.disk_full_text(exc, stage) if diskio.is_disk_full(exc) else str(exc)
        raise BadInput(f"{why}; {out} is unchanged" + ("; free space and export again" if diskio.is_disk_full(exc)
                                                       else ""))
    finally:
        shutil.rmtree(stage, ignore_errors=True)      # a failed export leaves no staging folder


def _export(args, ckpt: Path, model, meta: dict, out: Path, stage: Path) -> int:
    """Build the whole export in `stage`, check it, switch it in at `out`."""
    import torch

    from ops import layers
    from ops.drafter import diskio
    from ops.drafter import formats as fm
    from ops.export import switch
    from ops.export.verifier import write_verifier

    cfg = model.cfg
    target = Path(target_ref(args.target or meta.get("target", "")))
    dtype = getattr(torch, args.dtype)
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in model.trainable_state().items()}
    fmts = ("sglang", "speculators") if args.format == "both" else (args.format,)
    stage.mkdir()
    try:
        configs = {"sglang": lambda: fm.sglang_config(cfg, args.dtype),
                   "speculators": lambda: fm.speculators_config(
                       cfg, args.dtype, args.speculative_tokens or int(meta.get("ttt_steps", 7)),
                       target_ref(args.target or meta.get("target", "")))}
        written = {}
        for fmt in fmts:
            tensors = fm.to_format(state, fmt)
            head = None
            if fmt == "speculators":
                local, head = target_head([str(target), meta.get("target", "")], cfg)
                tensors["embed_tokens.weight"] = head.embed.to(dtype).contiguous()
            written[fmt] = write_format(stage, fmt, configs[fmt](), tensors)
            if head is not None:
                write_verifier(written[fmt], local, head)
            print(f"export: {fmt} -> {out / fmt}", flush=True)
    except ValueError as exc:          # e.g. no SGLang config ids reach the canonical layers
        raise BadInput(str(exc)) from None
    info = {
        "checkpoint": str(ckpt), "step": meta.get("step"), "dtype": args.dtype,
        "target": target_ref(args.target or meta.get("target", "")), "target_architecture": cfg.target_architecture,
        "target_model_type": cfg.target_model_type, "target_num_layers": cfg.target_num_layers,
        "draft_vocab_size": cfg.draft_vocab_size, "formats": {k: str(out / k) for k in written},
        "holdout": meta.get("holdout", []), "data": meta.get("data"), "samples": meta.get("samples"),
        **layers.engine_ids(cfg.aux_layer_ids, cfg.target_num_layers or max(cfg.aux_layer_ids) + 1,
                            cfg.target_architecture),
    }
    code = 0
    if args.check:
        try:
            info["check"] = check(model, written, meta, args, target)
        except (ValueError, KeyError) as exc:
            raise BadInput(f"--check could not run: {exc}")
        except OSError as exc:
            if diskio.is_disk_full(exc):
                raise
            raise BadInput(f"--check could not run: {exc}")
        code = 0 if info["check"]["ok"] else 1
    diskio.write_text(stage / fm.INFO_FILE, json.dumps(info, indent=1) + "\n")
    switch.commit(out, stage)
    print(f"done: step {meta.get('step')} exported as {', '.join(fmts)} ({args.dtype}) to {out}"
          + ("" if not args.check else f"; check {'ok' if code == 0 else 'FAILED'}"), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
