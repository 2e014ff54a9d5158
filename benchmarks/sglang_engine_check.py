"""extract's two engines on one target in one invocation (issue 18): the same
samples through `python -m ops.extract --engine hf` and `--engine sglang`, the
files of both verified and compared tensor by tensor, and the rates set against
the floors measured in the same call.

Targets: a workspace's (`--workspace DIR`: its [target] path and
data/prepared, e.g. the demo's), or a random one built like
extract_throughput.py's (`--shape moe|8b|tiny [--layers N]`).
Output roots: `--outs /dev/shm/x,/root/x` (memory for the compute side, the
disk for the write floor); each root gets `--durable fsync` on tmpfs (no
O_DIRECT there) and `--durable direct` elsewhere unless `--durable` says.

Prints, per root and engine: tok/s over the window from "target loaded" to
"complete" (ratios: sglang/hf, against the active-parameter compute floor
and the write floor); per tensor the max relative difference of the sglang
files against the hf files (max |a - b| / max |a|, over every sample); and
`ops.verify --deep --recompute` of the sglang output against the HF target.

Usage: python benchmarks/sglang_engine_check.py (--workspace DIR | --shape S) --outs A,B
       [--engines hf,sglang] [--samples N --seq T] [--sglang-args JSON] [--verify N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_common as bc  # noqa: E402
from benchmarks import extract_throughput as et  # noqa: E402
from ops.extract.spec import SPEC as EXTRACT  # noqa: E402


def log(msg: str) -> None:
    print(msg, flush=True)


def is_tmpfs(path: Path) -> bool:
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, mnt, fstype, *_ = line.split()
        if str(path.resolve()).startswith(mnt) and len(mnt) > len(best):
            best, kind = mnt, fstype
    return kind == "tmpfs"


def compare(hf_out: Path, sg_out: Path) -> dict[str, float]:
    """Per tensor name, the max over samples of max|sg - hf| / max|hf| (ids and
    masks compared for equality: 0.0 or 1.0)."""
    from safetensors.torch import load_file

    worst: dict[str, float] = {}
    files = sorted(p.relative_to(hf_out) for p in hf_out.rglob("*.safetensors"))
    assert files, f"no sample files under {hf_out}"
    for rel in files:
        a, b = load_file(str(hf_out / rel)), load_file(str(sg_out / rel))
        assert a.keys() == b.keys(), (rel, a.keys(), b.keys())
        for k in a:
            x, y = a[k], b[k]
            assert x.shape == y.shape, (rel, k, x.shape, y.shape)
            if x.is_floating_point():
                x, y = x.float(), y.float()
                d = float((x - y).abs().max() / x.abs().max().clamp_min(1e-30))
            else:
                d = 0.0 if bool((x == y).all()) else 1.0
            worst[k] = max(worst.get(k, 0.0), d)
    worst["_files"] = len(files)
    return worst


def verify(out: Path, target: Path, deep: int) -> tuple[int, str]:
    report = out.parent / f"{out.name}-verify.json"
    p = subprocess.run([sys.executable, "-m", "ops.verify", "--input", str(out), "--deep", str(deep),
                        "--recompute", str(deep), "--target", str(target), "--report", str(report)],
                       cwd=bc.ROOT, capture_output=True, text=True)
    said = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith("verify: ") and "report" not in ln]
    deep = json.loads(report.read_text()).get("deep") if report.exists() else None
    recomputed = f"; recomputed {deep.get('recomputed')}" if isinstance(deep, dict) else ""
    return p.returncode, (said[-1] if said else (p.stdout + p.stderr)[-300:]) + recomputed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, help="take [target].path and data/prepared from this workspace")
    ap.add_argument("--shape", choices=sorted(et.SHAPES), help="or build a random target of this shape")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--outs", required=True, help="comma-separated output roots")
    ap.add_argument("--engines", default="hf,sglang")
    ap.add_argument("--durable", default=None, help="--durable for every root (default: by filesystem)")
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--dtype", default=None, help="--dtype for both engines (SGLang takes bfloat16/float16)")
    ap.add_argument("--sglang-args", default=None, help="JSON list passed as --extra-args to engine sglang")
    ap.add_argument("--mem-fraction-static", type=float, default=None)
    ap.add_argument("--verify", type=int, default=4, help="verify --deep N --recompute N of each sglang output")
    ap.add_argument("--work", type=Path, default=Path("/root/sglang-check"), help="where a built target goes")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    import torch

    log(bc.device_line())
    device = bc.torch_device()
    if a.workspace:
        pipe = tomllib.loads((a.workspace / "eagle3.toml").read_text())
        target = (a.workspace / pipe["target"]["path"]).resolve()
        prepared = (a.workspace / "data" / "prepared").resolve()
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(str(target))
        model = AutoModelForCausalLM.from_pretrained(str(target), dtype="auto")
        dtype = next(model.parameters()).dtype
    else:
        cfg, dtype_name, note = et.build_config(a.shape, a.layers)
        shutil.rmtree(a.work, ignore_errors=True)
        target, prepared = a.work / "target", a.work / "prepared"
        model = et.build_target(cfg, dtype_name, target, device)
        _, _, _, samples_default, seq_default = et.SHAPES[a.shape]
        tokens = bc.write_prepared(prepared, a.samples or samples_default, a.seq or seq_default, cfg.vocab_size)
        dtype = getattr(torch, dtype_name)
        log(f"built {a.shape} ({type(cfg).__name__}, {cfg.num_hidden_layers} layers{'; ' + note if note else ''}): "
            f"{tokens:,} tokens")
    total, active = et.counted_params(model, cfg)
    del model
    torch.cuda.empty_cache() if device.type == "cuda" else None
    rate, what = bc.matmul_rate(device, dtype)
    compute_floor = rate / (2 * active)
    from ops.layers import parse_layer_ids

    n_aux = len(parse_layer_ids("auto", cfg.num_hidden_layers))
    elem = torch.tensor([], dtype=dtype).element_size()
    bytes_token = (n_aux + 1) * cfg.hidden_size * elem + 8 + 1
    log(f"target {target}: {total / 1e6:,.1f} M params, {active / 1e6:,.1f} M active a token; matmul {what} "
        f"{rate / 1e12:.0f} TFLOP/s -> active floor {compute_floor:,.0f} tok/s; {bytes_token / 1024:.1f} KiB a token")

    busy = et.BusySampler()
    result = {"target": str(target), "active_params": active, "compute_floor_tok_s": compute_floor, "roots": {}}
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    for root in [Path(r) for r in a.outs.split(",") if r]:
        root.mkdir(parents=True, exist_ok=True)
        tmpfs = is_tmpfs(root)
        mode = a.durable or ("fsync" if tmpfs else "direct")
        bw, how = ((float("nan"), "tmpfs") if tmpfs
                   else bc.direct_write_rate(root / "probe", 4 << 30, streams=EXTRACT.params["writers"]))
        write_floor = bw / bytes_token
        log(f"root {root} ({'tmpfs' if tmpfs else how}; --durable {mode}): write floor "
            + ("none (memory)" if tmpfs else f"{write_floor:,.0f} tok/s ({bw / 1e9:.2f} GB/s)"))
        runs = {}
        for engine in engines:
            out = root / f"out-{engine}"
            shutil.rmtree(out, ignore_errors=True)
            extra = ["--engine", engine] + (["--dtype", a.dtype] if a.dtype else [])
            if engine == "sglang":
                if a.sglang_args:
                    extra += ["--extra-args", a.sglang_args]
                if a.mem_fraction_static:
                    extra += ["--mem-fraction-static", str(a.mem_fraction_static)]
            r = et.run_extract(target, prepared, out, mode, a.token_budget, busy, tuple(extra))
            runs[engine] = r
            gpu = f", GPU busy {r['gpu_busy']:.0%}" if r["gpu_busy"] is not None else ""
            log(f"  {engine}: {r['tok_s']:,.0f} tok/s ({r['tokens']:,} tokens in {r['window_s']:.1f} s after a "
                f"{r['load_s']:.0f} s load; steady {r['steady_tok_s'] or 0:,.0f}) = {r['tok_s'] / compute_floor:.3f} "
                f"of the active floor" + ("" if tmpfs else f", {r['tok_s'] / write_floor:.2f} of the write floor")
                + gpu + (f" (steady {r['steady_gpu_busy']:.0%})" if r.get("steady_gpu_busy") is not None else ""))
            if r.get("time"):
                log(f"    {r['time']}")
        if "hf" in runs and "sglang" in runs:
            ratio = runs["sglang"]["tok_s"] / runs["hf"]["tok_s"]
            steady = ((runs["sglang"]["steady_tok_s"] or 0) / runs["hf"]["steady_tok_s"]
                      if runs["hf"]["steady_tok_s"] else None)
            log(f"  sglang / hf: {ratio:.2f}x" + (f" (steady {steady:.2f}x)" if steady else ""))
            diff = compare(root / "out-hf", root / "out-sglang")
            log(f"  max relative difference sglang vs hf over {diff.pop('_files')} files: "
                + ", ".join(f"{k} {v:.2e}" for k, v in sorted(diff.items())))
            runs["diff"] = diff
        if "sglang" in runs and a.verify:
            code, last = verify(root / "out-sglang", target, a.verify)
            log(f"  verify --deep {a.verify} --recompute {a.verify} of the sglang output: exit {code}: {last}")
            runs["verify"] = {"exit": code, "last": last}
        cfg_file = root / "out-sglang" / "data_config.json"
        if cfg_file.exists():
            dc = json.loads(cfg_file.read_text())
            log(f"  data_config: status {dc.get('status')}, {dc.get('total_samples')} samples, "
                f"method {dc.get('extraction_method')} {dc.get('sglang_version')}, layers {dc.get('layer_ids')}, "
                f"sglang capture {dc.get('sglang_layers_to_capture')}")
        result["roots"][str(root)] = {"write_floor_tok_s": None if tmpfs else write_floor, "runs": runs}
        for engine in engines:
            shutil.rmtree(root / f"out-{engine}", ignore_errors=True)
    busy.stop()
    bc.save_json(result, a.json or bc.default_json(f"sglang_engine_check_{a.shape or 'workspace'}.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
