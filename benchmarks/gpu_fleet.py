"""Issue 13 on whatever GPUs the machine has: the console and the stages with
torch.cuda.device_count() ranks (1 on a one-GPU machine: every step then says so).

Steps (each in its own try; each prints one `step N: ...` line):
  1  extract launched through the real CLI as a torchrun stage; while it runs,
     `status --json` against nvidia-smi (memory per GPU, every worker mapped
     to its run) and the TUI captured from tmux at 160x48 and 80x24
  2  extraction tok/s, all ranks against 1 rank (torchrun -m ops.extract)
  3  ops.train DDP over all GPUs against 1 GPU with the same global batch
     (W ranks x accum 1 against 1 rank x accum W): tok/s, loss per step
  4  kill-workers on the running stage of step 1: NVML memory back, clean
     removes only partials, a re-run resumes; sha256 of every sample against
     an uninterrupted run
  5  the target spread with device_map over GPU(s) + CPU (max_memory below
     its size) against the 1-rank files of step 2
Usage: python benchmarks/gpu_fleet.py [--cpu-dry-run] [--out DIR] [--work DIR]
The target and the prepared data come from benchmarks/bench_common.py and
extract_throughput.py (random weights, nothing downloaded).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_common as bc  # noqa: E402

# Brief's shape: 8 layers, hidden 2048, vocab 32000 (about 0.5 B params in bf16).
GPU_TARGET = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=4096,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)
TOKS_RE = re.compile(r"(\d+) samples, (\d+) tokens extracted in .*?([\d.]+) tok/s\.")
PROGRESS_RE = re.compile(r"progress: step (\d+)/(\d+) loss ([\d.]+) .* tok/s (\d+)")
RESULTS: dict = {"steps": {}}
LOG_LINES: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)
    LOG_LINES.append(msg)


def env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(bc.ROOT), os.environ.get("PYTHONPATH")])))


def sh(argv: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=bc.ROOT, env=kw.pop("env", env()), capture_output=True, text=True,
                          timeout=timeout, **kw)


def cli(ws: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return sh([sys.executable, "-m", "eagle3_console.cli", "-w", str(ws), *args], timeout=timeout)


def torchrun(nproc: int) -> list[str]:
    # --standalone: a free local rendezvous port, so two runs never collide.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]


def extract_argv(nproc: int, target: Path, prepared: Path, out: Path, budget: int, extra=()) -> list[str]:
    return torchrun(nproc) + ["-m", "ops.extract", "--target", str(target), "--input", str(prepared),
                              "--output", str(out), "--token-budget", str(budget), "--durable", "syncfs",
                              "--progress-interval", "2", *extra]


def run_extract(nproc: int, target: Path, prepared: Path, out: Path, budget: int) -> dict:
    t0 = time.monotonic()
    p = sh(extract_argv(nproc, target, prepared, out, budget), timeout=240)
    m = TOKS_RE.search(p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"extract x{nproc} exited {p.returncode}: {(p.stdout + p.stderr)[-1500:]}")
    return {"ranks": nproc, "samples": int(m.group(1)), "tokens": int(m.group(2)),
            "tok_s": float(m.group(3)), "wall_s": time.monotonic() - t0}


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def sha_listing(root: Path) -> dict[str, str]:
    from concurrent.futures import ThreadPoolExecutor

    files = sorted(p for p in root.rglob("*") if p.is_file())
    # hashlib drops the GIL: tens of GB hash in seconds on the machine's cores.
    with ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 1))) as pool:
        return {str(p.relative_to(root)): h for p, h in zip(files, pool.map(_sha, files))}


def sample_files(listing: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in listing.items() if k.endswith(".safetensors") and "data_" in k}


def nvml_used() -> dict[int, int] | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        return {i: int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used)
                for i in range(pynvml.nvmlDeviceGetCount())}
    except Exception:  # noqa: BLE001 - no driver: the caller says so
        return None


def nvml_versions() -> dict | str:
    """used MiB as NVML's v1 (the console's call) and v2 (reserved memory left out) say:
    which one nvidia-smi follows explains a gap between them."""
    try:
        import pynvml
        pynvml.nvmlInit()
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            v1 = pynvml.nvmlDeviceGetMemoryInfo(h).used
            v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used
            out[str(i)] = [round(v1 / 2**20), round(v2 / 2**20)]
        return out
    except Exception as exc:  # noqa: BLE001 - an older binding without v2: said
        return f"{type(exc).__name__}: {exc}"


def nvml_pids() -> dict[int, list[int]]:
    import pynvml
    pynvml.nvmlInit()
    return {i: [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))]
            for i in range(pynvml.nvmlDeviceGetCount())}


def step(n: int, fn, *args):
    t0 = time.monotonic()
    try:
        line, data = fn(*args)
    except Exception as exc:  # noqa: BLE001 - one step failing must not stop the others
        line, data = f"FAILED: {type(exc).__name__}: {exc}"[:600], {"error": traceback.format_exc()[-4000:]}
    data["seconds"] = round(time.monotonic() - t0, 1)
    RESULTS["steps"][str(n)] = dict(data, line=line)
    log(f"step {n}: {line} ({data['seconds']} s)")
    return data


# ---------------------------------------------------------------- the workspace

def write_workspace(ws: Path, target: Path, cfg: dict, prepared: Path, out: Path, nproc: int, budget: int,
                    samples: int) -> None:
    ws.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "{nproc}",
            "-m", "ops.extract", "--target", str(target), "--input", str(prepared), "--output", "{output}",
            "--token-budget", "{budget}", "--durable", "syncfs", "--progress-interval", "2"]
    (ws / "eagle3.toml").write_text(f"""
[target]
path = "{target}"
num_layers = {cfg['num_hidden_layers']}
hidden_size = {cfg['hidden_size']}
dtype = "{cfg['dtype']}"
vocab_size = {cfg['vocab_size']}

# The op's program under torchrun: a custom argv stage (the op runs one process).
[stages.extract]
argv = {json.dumps(argv)}
params = {{ nproc = {nproc}, output = "{out}", budget = {budget} }}
outputs = ["{out}"]
expected_samples = {samples}
""")


def stage_of(status: dict, name: str) -> dict:
    return next(s for s in status.get("stages", []) if s["name"] == name)


def status_json(ws: Path) -> dict:
    p = cli(ws, "status", "--json", timeout=60)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"status --json exited {p.returncode}, not JSON: {(p.stdout + p.stderr)[-800:]}") from exc


def wait_stage(ws: Path, statuses: tuple[str, ...], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = stage_of(status_json(ws), "extract")
        if st["status"] in statuses or time.monotonic() > deadline:
            return st
        time.sleep(1.0)


def count_samples(out: Path) -> int:
    return sum(1 for p in out.rglob("data_*.safetensors")) if out.is_dir() else 0


class Tui:
    """tmux from the unpacked debs (TMUX_BIN) when it runs, else Textual's run_test."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.bin = os.environ.get("TMUX_BIN") or shutil.which("tmux")
        self.how = "none"
        if self.bin:
            try:
                p = subprocess.run([self.bin, "-V"], capture_output=True, text=True)
            except OSError as exc:
                p = subprocess.CompletedProcess([], 127, "", str(exc))
            if p.returncode == 0:
                self.how = f"tmux ({p.stdout.strip()} at {self.bin})"
            else:
                self.how = f"run_test (tmux at {self.bin} does not run: {(p.stderr or p.stdout).strip()[:200]})"
                self.bin = None
        else:
            self.how = "run_test (no tmux binary)"
        self.sock = f"fleet{os.getpid()}"

    def start(self, ws: Path, sizes) -> None:
        if not self.bin:
            return
        for w, h in sizes:
            subprocess.run([self.bin, "-L", self.sock, "new-session", "-d", "-s", f"s{w}x{h}", "-x", str(w),
                            "-y", str(h), f"cd {bc.ROOT} && {sys.executable} -m eagle3_console.cli -w {ws}; echo TUI exited $?; sleep 600"],
                           env=env(), check=True)

    def capture(self, ws: Path, sizes) -> dict[str, str]:
        texts = {}
        if self.bin:
            for w, h in sizes:
                p = subprocess.run([self.bin, "-L", self.sock, "capture-pane", "-p", "-t", f"s{w}x{h}"],
                                   capture_output=True, text=True)
                texts[f"{w}x{h}"] = p.stdout if p.returncode == 0 else f"capture failed: {p.stderr}"
            subprocess.run([self.bin, "-L", self.sock, "kill-server"], capture_output=True)
        else:
            texts = self._run_test(ws, sizes)
        for size, text in texts.items():
            (self.out / f"tui_{size}.txt").write_text(text)
        return texts

    def _run_test(self, ws: Path, sizes) -> dict[str, str]:
        import asyncio

        from eagle3_console.tui.app import ConsoleApp
        from eagle3_console.kernel.workspace import Workspace

        texts = {}

        async def one(w: int, h: int) -> str:
            app = ConsoleApp(Workspace.at(ws))
            async with app.run_test(size=(w, h)) as pilot:
                await pilot.pause(4.0)
                app.save_screenshot(f"tui_{w}x{h}.svg", str(self.out))
                pane = app.query_one("#gpus")
                texts = (str(s.render()) for s in [pane, *pane.query("*")] if hasattr(s, "render"))
                return "\n".join(t for t in texts if not t.startswith("<"))   # reprs of blank widgets

        for w, h in sizes:
            try:
                texts[f"{w}x{h}"] = asyncio.run(one(w, h))
            except Exception as exc:  # noqa: BLE001 - textual missing or the app failed: said in the capture
                texts[f"{w}x{h}"] = f"run_test failed: {type(exc).__name__}: {exc}"
        return texts


# ---------------------------------------------------------------- steps

def step1(ctx: dict) -> tuple[str, dict]:
    """Start the stage, check status --json against nvidia-smi while it runs, capture the TUI."""
    ws, out, n = ctx["ws"], ctx["out4"], ctx["ngpu"]
    shutil.rmtree(out, ignore_errors=True)
    sizes = [(160, 48), (80, 24)]
    tui = Tui(ctx["OUT"])
    p = cli(ws, "run", "extract")
    if p.returncode != 0:
        raise RuntimeError(f"run extract exited {p.returncode}: {(p.stdout + p.stderr)[-800:]}")
    tui.start(ws, sizes)
    data = {"ranks": n, "tui": tui.how, "run": p.stdout.strip()[-300:]}
    if not ctx["cuda"]:
        deadline = time.monotonic() + 60
        while count_samples(out) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        data["tui_text"] = {k: v[-400:] for k, v in tui.capture(ws, sizes).items()}
        return f"skipped: no CUDA (the stage ran through the CLI with {n} rank(s) on CPU; TUI via {tui.how})", data
    # Every rank on its GPU: NVML lists n compute processes.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        pids = nvml_pids()
        if sum(len([p for p in v if p != os.getpid()]) for v in pids.values()) >= n:
            break
        if stage_of(status_json(ws), "extract")["status"] in ("failed", "succeeded", "killed", "lost"):
            break       # the checks below then say what the stage did
        time.sleep(0.5)
    time.sleep(1.0)    # past the CUDA context: the memory moves less between the two readings
    smi = sh(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"])
    status = status_json(ws)
    smi2 = sh(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"])
    (ctx["OUT"] / "status_during_run.json").write_text(json.dumps(
        {"status": status, "nvidia_smi_before": smi.stdout, "nvidia_smi_after": smi2.stdout}, indent=1))
    st = stage_of(status, "extract")
    running = st["status"] == "running"
    smi_rows = {int(r.split(",")[0]): (int(r.split(",")[1]), int(r.split(",")[2]))
                for r in smi.stdout.strip().splitlines()}
    smi2_rows = {int(r.split(",")[0]): int(r.split(",")[1]) for r in smi2.stdout.strip().splitlines()}
    gpus = status.get("gpus") or []
    tol_mib = 512      # memory grows between the readings while the ranks run
    mem = []
    for idx, (used, total) in smi_rows.items():
        g = next((g for g in gpus if g["index"] == idx), None)
        if g is None or g.get("mem_used") is None or g.get("mem_total") is None:
            mem.append({"index": idx, "listed": g is not None, "console": g})
            continue
        used_c, total_c = g["mem_used"] / 2**20, g["mem_total"] / 2**20
        lo, hi = min(used, smi2_rows[idx]), max(used, smi2_rows[idx])
        diff = 0.0 if lo <= used_c <= hi else min(abs(used_c - lo), abs(used_c - hi))
        mem.append({"index": idx, "listed": True, "console_used_mib": round(used_c), "smi_used_mib": [used, smi2_rows[idx]],
                    "diff_mib": round(diff, 1), "total_diff_mib": round(abs(total_c - total), 1),
                    "ok": diff <= tol_mib and abs(total_c - total) <= 1})
    procs = [dict(gpu=g["index"], pid=pr["pid"], run_id=pr.get("run_id"), stage=pr.get("stage"), how=pr.get("how"))
             for g in gpus for pr in g.get("processes", [])]
    # This script holds a context on GPU 0 (it built the target): not a worker of the run.
    procs = [pr for pr in procs if pr["pid"] != os.getpid()]
    mapped = [pr for pr in procs if pr["run_id"] == st["run_id"]]
    data["nvml_v1_v2_used_mib"] = nvml_versions()
    time.sleep(2.0)    # the TUI's next refresh after the workers reached their GPUs
    texts = tui.capture(ws, sizes)
    shown = {size: sum(1 for i in smi_rows if re.search(rf"\b{i}\b", t)) for size, t in texts.items()}
    data.update(stage_status=st["status"], run_id=st["run_id"], memory=mem, tolerance_mib=tol_mib,
                processes=procs, mapped=len(mapped), gpus_listed=len(gpus), gpus_smi=len(smi_rows),
                tui_gpu_indices_seen=shown, gpus_unavailable=status.get("gpus_unavailable"))
    ok = all(m.get("ok") for m in mem) and len(gpus) == len(smi_rows) and len(mapped) >= n and running
    return (f"{'OK' if ok else 'CHECK'}: stage {st['status']} with {n} rank(s); status --json lists "
            f"{len(gpus)}/{len(smi_rows)} GPUs, memory within {tol_mib} MiB of nvidia-smi on "
            f"{sum(1 for m in mem if m.get('ok'))}/{len(mem)} (max diff "
            f"{max((m.get('diff_mib', 0) for m in mem), default=0):.0f} MiB); {len(mapped)}/{len(procs)} GPU "
            f"processes mapped to run {st['run_id']}; TUI via {tui.how}, files tui_160x48/80x24"), data


def step2(ctx: dict) -> tuple[str, dict]:
    n = ctx["ngpu"]
    out_n, out_1 = ctx["work"] / "x2-n", ctx["work"] / "x2-1"
    rn = run_extract(n, ctx["target"], ctx["prep2"], out_n, ctx["budget"])
    shutil.rmtree(out_n, ignore_errors=True)
    r1 = run_extract(1, ctx["target"], ctx["prep2"], out_1, ctx["budget"])   # kept: step 5's reference
    ctx["ref1"] = out_1
    ctx["rate_n"] = rn["tok_s"]
    ratio = rn["tok_s"] / r1["tok_s"]
    note = " (one GPU: 1 rank against 1 rank)" if n == 1 else f" = {ratio / n:.2f} x ranks (goal 0.9)"
    where = "" if ctx["cuda"] else " [CPU dry run]"
    return (f"extract {n} rank(s) {rn['tok_s']:,.0f} tok/s, 1 rank {r1['tok_s']:,.0f} tok/s, ratio {ratio:.2f}"
            f"{note}; {rn['tokens']:,} tokens{where}", {"n": rn, "one": r1, "ratio": ratio})


def train_run(ctx: dict, nproc: int, accum: int, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    argv = torchrun(nproc) + ["-m", "ops.train", "--data", str(ctx["train_data"]), "--vocab", str(ctx["vocab"]),
                              "--target", str(ctx["target"]), "--output", str(out),
                              "--max-steps", str(ctx["train_steps"]), "--log-every", "1",
                              "--token-budget", str(ctx["train_budget"]), "--grad-accum", str(accum),
                              "--ttt-steps", str(ctx["ttt"]), "--warmup-ratio", "0", "--save-every", "1000000",
                              "--keep", "1", "--workers", "1", "--max-len", str(ctx["seq"])]
    p = sh(argv, timeout=200)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()] \
        if (out / "metrics.jsonl").exists() else []
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"train x{nproc} exited {p.returncode}: {(p.stdout + p.stderr)[-1500:]}")
    toks = [r["tok_s"] for r in rows[2:]] or [r["tok_s"] for r in rows]
    return {"ranks": nproc, "accum": accum, "loss": [r["loss"] for r in rows], "tok_s": sum(toks) / len(toks)}


def step3(ctx: dict) -> tuple[str, dict]:
    n = ctx["ngpu"]
    rn = train_run(ctx, n, 1, ctx["work"] / "t-n")
    r1 = train_run(ctx, 1, n, ctx["work"] / "t-1")
    diffs = [abs(a - b) for a, b in zip(rn["loss"], r1["loss"])]
    ratio = rn["tok_s"] / r1["tok_s"]
    note = ("one GPU: 1 vs 1 (run-to-run)" if n == 1 else
            f"{ratio / n:.2f} x GPUs (goal 0.9)")
    return (f"train DDP {n} GPU(s) x accum 1: {rn['tok_s']:,.0f} tok/s; 1 GPU x accum {n}: {r1['tok_s']:,.0f} "
            f"tok/s; ratio {ratio:.2f} ({note}); loss first/last {rn['loss'][0]:.4f}/{rn['loss'][-1]:.4f} vs "
            f"{r1['loss'][0]:.4f}/{r1['loss'][-1]:.4f}, max |diff| per step {max(diffs):.2e} over {len(diffs)} steps",
            {"n": rn, "one": r1, "ratio": ratio, "max_abs_loss_diff": max(diffs), "diffs": diffs})


def step4(ctx: dict) -> tuple[str, dict]:
    ws, out, n = ctx["ws"], ctx["out4"], ctx["ngpu"]
    data: dict = {"ranks": n}
    st = stage_of(status_json(ws), "extract")
    data["status_before_kill"] = st["status"]
    done_at_kill = count_samples(out)
    if st["status"] == "running":
        before = nvml_used() if ctx["cuda"] else None
        p = cli(ws, "kill-workers", "extract", "--yes", timeout=120)
        data["kill"] = {"rc": p.returncode, "out": (p.stdout + p.stderr)[-1200:]}
        done_at_kill = count_samples(out)
        time.sleep(0.5)
        after = nvml_used() if ctx["cuda"] else None
        if after is not None:
            # Read just before step 1: the driver's share and this script's context, no worker.
            base = ctx["idle_mem"] or {}
            data["nvml"] = {str(i): {"during": before.get(i), "after": after[i], "idle": base.get(i)} for i in after}
            released = all(after[i] <= base.get(i, 0) + 64 * 2**20 for i in after)
            # This script's own CUDA context (it built the target) is in the baseline, not a leftover.
            pids_left = {i: [p for p in v if p != os.getpid()] for i, v in nvml_pids().items()}
            released = released and not any(pids_left.values())
        else:
            released, pids_left = None, {}
        killed = True
    else:
        killed, released, pids_left = False, None, {}
        data["note"] = f"the stage was {st['status']} before kill-workers (it finished too fast): no kill tested"
    data["samples_at_kill"] = done_at_kill
    listing0 = sha_listing(out)
    p = cli(ws, "clean", "extract", "--yes", timeout=120)
    data["clean"] = {"rc": p.returncode, "out": (p.stdout + p.stderr)[-1200:]}
    listing1 = sha_listing(out)
    gone = sorted(set(listing0) - set(listing1))
    changed = sorted(k for k in listing1 if k in listing0 and listing0[k] != listing1[k])
    from ops.common import TMP_SUFFIX
    partial_only = all(k.endswith(TMP_SUFFIX) for k in gone) and not changed
    data.update(removed=gone[:50], removed_count=len(gone), changed=changed[:20])
    p = cli(ws, "run", "extract", timeout=60)
    data["rerun"] = (p.stdout + p.stderr)[-400:]
    fin = wait_stage(ws, ("succeeded", "failed", "killed", "lost"), 240)
    data["rerun_status"] = fin["status"]
    logs = sorted((ws / ".eagle3" / "logs").glob("*-extract.log"))
    m = re.search(r"; (\d+) already on disk", logs[-1].read_text(errors="replace")) if logs else None
    data["resumed_from"] = int(m.group(1)) if m else None
    ref = ctx["work"] / "x4-ref"
    rr = run_extract(n, ctx["target"], ctx["prep4"], ref, ctx["budget"])
    a, b = sample_files(sha_listing(out)), sample_files(sha_listing(ref))
    same = sorted(k for k in a if b.get(k) == a[k])
    differ = sorted(set(a) ^ set(b) | {k for k in a if k in b and a[k] != b[k]})
    data.update(samples_resumed=len(a), samples_reference=len(b), identical=len(same), differ=differ[:20])
    tol = ""
    if differ and set(a) == set(b):
        tol = "; " + tensor_diff(out, ref, differ)
    shutil.rmtree(ref, ignore_errors=True)
    mem_txt = ("memory back to idle on every GPU (NVML)" if released else
               f"memory NOT back: {data.get('nvml')}, pids {pids_left}" if released is False else "no NVML")
    head = (f"kill-workers rc {data['kill']['rc']} at {done_at_kill} samples, {mem_txt}; " if killed
            else f"NOT killed ({data['note']}); ")
    where = "" if ctx["cuda"] else " [CPU dry run]"
    ok = killed and released is not False and partial_only and fin["status"] == "succeeded" and not differ
    return (f"{'OK' if ok else 'CHECK'}: {head}clean rc {data['clean']['rc']} removed {len(gone)} file(s), "
            f"{'only partials' if partial_only else 'NOT only partials: ' + str(gone[:5] + changed[:5])}; re-run "
            f"{fin['status']} (it found {data['resumed_from']} samples on disk); {len(same)}/{len(b)} samples sha256-identical to an uninterrupted {rr['ranks']}-rank "
            f"run{tol}{where}"), data


def tensor_diff(out: Path, ref: Path, names: list[str]) -> str:
    from safetensors.torch import load_file

    worst = 0.0
    for name in names:
        x, y = load_file(str(out / name)), load_file(str(ref / name))
        for k in x:
            worst = max(worst, float((x[k].float() - y[k].float()).abs().max()))
    return f"differing files' max abs tensor diff {worst:.3e}"


def step5(ctx: dict) -> tuple[str, dict]:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ops.target_model.capture import HiddenStateCapture
    from ops.prepared import load_samples
    from ops.formats import sample_path
    from ops.layers import parse_layer_ids

    if not ctx["cuda"]:
        return "skipped: no CUDA (a GPU+CPU spread needs a GPU)", {}
    ref = ctx.get("ref1")
    if ref is None or not ref.is_dir():
        raise RuntimeError("step 2's 1-rank output is missing: nothing to compare against")
    n = ctx["ngpu"]
    weights = sum(p.stat().st_size for p in ctx["target"].glob("*.safetensors"))
    # Each GPU gets a third of the weights: n GPUs hold at most n/3 of it, the CPU the rest.
    per_gpu = int(weights / 3)
    max_memory = {i: per_gpu for i in range(n)} | {"cpu": 4 * weights}
    model = AutoModelForCausalLM.from_pretrained(str(ctx["target"]), dtype=torch.bfloat16, device_map="auto",
                                                 max_memory=max_memory)
    model.eval()
    placed = sorted({str(v) for v in model.hf_device_map.values()})
    cfg = json.loads((ctx["target"] / "config.json").read_text())
    layer_ids = parse_layer_ids("auto", cfg["num_hidden_layers"])
    cap = HiddenStateCapture(model, layer_ids)
    # Offloaded modules keep their weights on "meta" between calls; the hooks move inputs
    # to the execution device, which is the first GPU.
    dev = torch.device("cuda:0")
    samples = load_samples(ctx["prep2"], max_seq_len=4096, limit=None)
    worst_abs = worst_rel = 0.0
    k = min(8, len(samples.lengths()))
    with torch.inference_mode():
        for idx in range(k):
            tok, _ = samples.get(idx)
            ids = torch.from_numpy(tok.astype("int64"))[None].to(dev)
            aux, final = cap(ids, torch.ones_like(ids))
            want = load_file(str(sample_path(ref, idx)))
            for got, key in ((aux, "aux_hidden_states"), (final, "final_hidden_states")):
                g, w = got[0].float().cpu(), want[key].float()
                d = (g - w).abs().max().item()
                worst_abs = max(worst_abs, d)
                worst_rel = max(worst_rel, d / max(w.abs().max().item(), 1e-12))
    cap.close()
    spread = any(p == "cpu" for p in placed) and any(p not in ("cpu", "disk") for p in placed)
    return (f"{'OK' if spread else 'CHECK'}: target ({weights / 2**30:.2f} GiB) on {placed} with max_memory "
            f"{per_gpu / 2**30:.2f} GiB a GPU ({n} GPU(s)) + CPU; {k} samples against 1-rank cuda:0 files: max abs "
            f"diff {worst_abs:.3e}, relative to the largest value {worst_rel:.3e} (bf16, batch of 1 vs token-budget "
            f"batches)"), {"placed": placed, "max_abs": worst_abs, "max_rel": worst_rel, "samples": k,
                           "max_memory": {str(a): b for a, b in max_memory.items()}}


# ---------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU (GPU-only checks skip)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-fleet-out")))
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a new one under /tmp)")
    ap.add_argument("--steps", default="1,2,3,4,5", help="which steps (1 and 4 share one run)")
    a = ap.parse_args()
    t_start = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    import torch

    from benchmarks.extract_throughput import build_config, build_target
    from benchmarks.train_throughput import write_vocab

    cuda = torch.cuda.is_available() and not a.cpu_dry_run
    ngpu = torch.cuda.device_count() if cuda else 2 if a.cpu_dry_run else 1
    work = a.work or Path(f"/tmp/gpu-fleet-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    idle_mem = nvml_used() if cuda else None
    log(bc.device_line() + f"; {ngpu} rank(s) used" + ("" if cuda else " (CPU dry run, gloo)"))
    RESULTS.update(device=bc.device_line(), ranks=ngpu, cuda=cuda, date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                   idle_mem=idle_mem)

    if cuda:
        shape, seq, s2, budget = GPU_TARGET, 1024, 256 * max(1, ngpu), 16384
        train_steps, train_budget, ttt = 12, 8192, 3
    else:
        shape, seq, s2, budget = bc.LLAMA_TINY, 64, 16, 256
        train_steps, train_budget, ttt = 4, 128, 2
    from benchmarks import extract_throughput as et
    et.SHAPES["fleet"] = ("LlamaConfig", shape, "bfloat16" if cuda else "float32", s2, seq)
    cfg, dtype_name, _ = build_config("fleet", None)
    t0 = time.monotonic()
    target = work / "target"
    model = build_target(cfg, dtype_name, target, torch.device("cuda:0" if cuda else "cpu"))
    del model
    if cuda:
        torch.cuda.empty_cache()
    prep2 = work / "prep2"
    bc.write_prepared(prep2, s2, seq, cfg.vocab_size, seed=2)
    log(f"target: Llama {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
        f"{dtype_name}, built in {time.monotonic() - t0:.0f} s; samples of {seq} tokens")
    ctx = dict(OUT=a.out, work=work, target=target, prep2=prep2, ngpu=ngpu, cuda=cuda, budget=budget, seq=seq,
               idle_mem=idle_mem, train_steps=train_steps, train_budget=train_budget, ttt=ttt)
    want = {int(s) for s in a.steps.split(",") if s.strip()}

    if 2 in want:
        step(2, step2, ctx)
    # Step 1/4's data: about 15 s of extraction at step 2's rate, at most ~14 GB a copy (two copies on disk).
    bytes_tok = 4 * cfg.hidden_size * (2 if cuda else 4)
    tokens4 = int(min(ctx.get("rate_n", 0) * 15, 14e9 / bytes_tok)) if cuda else 48 * seq
    s4 = max(8 * ngpu, tokens4 // seq)
    prep4 = work / "prep4"
    bc.write_prepared(prep4, s4, seq, cfg.vocab_size, seed=4)
    ctx.update(prep4=prep4, ws=work / "ws", out4=work / "hidden4")
    cfg_d = dict(num_hidden_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, dtype=dtype_name,
                 vocab_size=cfg.vocab_size)
    write_workspace(ctx["ws"], target, cfg_d, prep4, ctx["out4"], ngpu, budget, s4)
    log(f"workspace {ctx['ws']}: stage extract = torchrun x{ngpu} ops.extract, {s4} samples x {seq} tokens")
    if 1 in want or 4 in want:
        # The baseline step 4 compares against: this process's own CUDA context (from building
        # the target) included, nothing of step 2's runs (they have exited).
        ctx["idle_mem"] = nvml_used() if cuda else None
        RESULTS["baseline_mem_before_step1"] = ctx["idle_mem"]
        step(1, step1, ctx)
        if 4 in want:
            step(4, step4, ctx)
        else:
            cli(ctx["ws"], "kill-workers", "extract", "--yes")
    if 3 in want:
        try:
            ctx["vocab"] = work / "vocab"
            write_vocab(ctx["vocab"], cfg.vocab_size, min(8000, cfg.vocab_size // 2))
            # step 4's output (real hidden states) when it is whole, else step 2's 1-rank output.
            data = ctx["out4"] if (ctx["out4"] / "data_config.json").exists() and count_samples(ctx["out4"]) >= s4 \
                else ctx.get("ref1")
            ctx["train_data"] = data
        except Exception as exc:  # noqa: BLE001
            log(f"train data: {exc}")
        step(3, step3, ctx)
    if 5 in want:
        step(5, step5, ctx)

    logs = ctx["ws"] / ".eagle3" / "logs"
    if logs.is_dir():   # the stage runs' own logs (the work folder goes): their tails
        RESULTS["stage_logs"] = {p.name: p.read_text(errors="replace").splitlines()[-60:]
                                 for p in sorted(logs.glob("*.log"))}
    RESULTS["total_s"] = round(time.monotonic() - t_start, 1)
    (a.out / "results.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    shutil.rmtree(work, ignore_errors=True)
    log(f"done in {RESULTS['total_s']} s; results under {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
