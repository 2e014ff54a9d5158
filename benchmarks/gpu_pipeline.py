"""Issue 22: the whole pipeline driven by `watch --advance --until-done`, and what the operator sees.

Runs beside the console, as an operator's second terminal would: it starts
`watch` (and the exporter) in sessions of their own, so they outlive the device
call that started them, and an observer that only reads what the console
offers (`status`, `status --json`, the TUI in tmux, `/metrics`, the serve port).

    python benchmarks/gpu_pipeline.py start  --ws W --out O --pipeline F --assets A [--fault 0.9999]
    python benchmarks/gpu_pipeline.py wait   --out O --seconds N      # until bench's result or N s
    python benchmarks/gpu_pipeline.py finish --ws W --out O           # stop serve, reference extract, sha256, figures

`--fault X` starts the extract stage with mem_fraction_static X (SGLang's static
share too large: the forward's activations get no memory); the pipeline file
declares that share as the stage's batch_param, so watch's restart policy halves it.
The observer writes under O: boundary_NN_*.txt/.json (status and status --json
each time a stage's status or the server's state changes), timeline.jsonl,
tui_*_160x48.txt, metrics_*.txt, readiness.jsonl; finish writes summary.json.
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
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EXPORTER_PORT = 9457
TUI_SIZE = (160, 48)


def cli(ws: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_console.cli", "-w", str(ws), *args],
                          capture_output=True, text=True, timeout=timeout)


def spawn(argv: list[str], log: Path, cwd: Path | None = None, env: dict | None = None) -> int:
    """A process in a session of its own: it outlives this call and its SSH-like parent."""
    with open(log, "ab") as fh:
        p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=cwd, env=env)
    return p.pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:    # a zombie of ours (never waited) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------- start

def start(a) -> None:
    ws, out = Path(a.ws), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if ws.exists():
        shutil.rmtree(ws)
    ws.mkdir(parents=True)
    shutil.copytree(a.assets, ws / "assets")
    text = Path(a.pipeline).read_text()
    if a.fault:
        # Only the extract stage's share: serve keeps its own.
        lines = text.splitlines()
        at = next(i for i, ln in enumerate(lines) if ln.strip() == "[stages.extract]")
        end = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("[stages.")), len(lines))
        for i in range(at, end):
            if "mem_fraction_static" in lines[i]:
                lines[i] = re.sub(r"mem_fraction_static = [0-9.]+", f"mem_fraction_static = {a.fault}", lines[i])
        text = "\n".join(lines) + "\n"
    if a.train_pythonpath:
        # Training on the image's own torch: SGLang's runtime (torch 2.14.1) beside the image's older
        # cuDNN fails in train's backward (cuDNN Frontend error ... CUDNN_STATUS_BAD_PARAM, seen on the H200).
        for name in ("train", "export"):
            text = text.replace(f"[stages.{name}]\n",
                                f"[stages.{name}]\nenv = {{ PYTHONPATH = \"{a.train_pythonpath}\" }}\n", 1)
    (ws / "eagle3.toml").write_text(text)
    (out / "eagle3.toml").write_text(text)
    t0 = time.time()
    info = {"t0": t0, "ws": str(ws), "pipeline": a.pipeline, "fault": a.fault}
    info["watch_pid"] = spawn([sys.executable, "-m", "eagle3_console.cli", "-w", str(ws), "watch", "--advance",
                               "--until-done", "--interval", str(a.interval)], out / "watch.log")
    info["exporter_pid"] = spawn([sys.executable, "-m", "eagle3_console.cli", "-w", str(ws), "exporter", "--port",
                                  str(EXPORTER_PORT), "--interval", "2"], out / "exporter.log")
    info["observer_pid"] = spawn([sys.executable, str(Path(__file__).resolve()), "observe", "--ws", str(ws),
                                  "--out", str(out), "--watch-pid", str(info["watch_pid"])], out / "observer.log")
    (out / "start.json").write_text(json.dumps(info, indent=1))
    (out / "watch.pid").write_text(str(info["watch_pid"]))
    print(f"started: watch pid {info['watch_pid']}, exporter {info['exporter_pid']}, "
          f"observer {info['observer_pid']}; fault {a.fault}", flush=True)


def resume(a) -> None:
    """watch (and the observer) again on the same workspace, after a change by hand."""
    ws, out = Path(a.ws), Path(a.out)
    pid = spawn([sys.executable, "-m", "eagle3_console.cli", "-w", str(ws), "watch", "--advance", "--until-done",
                 "--interval", "3"], out / "watch.log")
    (out / "watch.pid").write_text(str(pid))
    (out / "observer_done").unlink(missing_ok=True)
    spawn([sys.executable, str(Path(__file__).resolve()), "observe", "--ws", str(ws), "--out", str(out),
           "--watch-pid", str(pid)], out / "observer.log")
    print(f"resumed: watch pid {pid}", flush=True)


# ---------------------------------------------------------------- observe

class Tmux:
    """The console's TUI in a tmux session of its own (TMUX_BIN: tmux unpacked from its debs)."""

    def __init__(self, ws: Path, out: Path) -> None:
        self.bin = os.environ.get("TMUX_BIN") or shutil.which("tmux")
        self.out, self.sock, self.ws = out, "p22", ws
        self.ok = False
        if not self.bin:
            return
        w, h = TUI_SIZE
        cmd = f"cd {ROOT} && {sys.executable} -m eagle3_console.cli -w {ws}; echo TUI exited $?; sleep 3600"
        p = subprocess.run([self.bin, "-L", self.sock, "new-session", "-d", "-s", "tui", "-x", str(w), "-y", str(h),
                            cmd], capture_output=True, text=True, env={**os.environ, "TERM": "xterm-256color"})
        self.ok = p.returncode == 0
        if not self.ok:
            (out / "tmux_error.txt").write_text(p.stdout + p.stderr)

    def capture(self, name: str) -> None:
        if not self.ok:
            return
        p = subprocess.run([self.bin, "-L", self.sock, "capture-pane", "-p", "-t", "tui"], capture_output=True, text=True)
        w, h = TUI_SIZE
        (self.out / f"tui_{name}_{w}x{h}.txt").write_text(p.stdout if p.returncode == 0 else p.stderr)

    def close(self) -> None:
        if self.ok:
            subprocess.run([self.bin, "-L", self.sock, "kill-server"], capture_output=True)


def http_code(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError as exc:
        reason = exc.reason
        raise reason if isinstance(reason, OSError) else OSError(str(reason)) from None


def readiness_timeline(port: int, out: Path, stop: threading.Event) -> None:
    """The real server asked the way each SGLang release can be: /ready, /health_generate
    (the fallback where /ready is absent), /model_info; every change of answer, timed."""
    from ops.readiness import HEALTH, MODEL_INFO, READY, Readiness

    base = f"http://127.0.0.1:{port}"
    probes = {}
    for start_at in (READY, HEALTH, MODEL_INFO):
        r = Readiness(lambda path, t: http_code(base + path, t), timeout=2.0, health_timeout=25.0)
        r.endpoint = start_at
        probes[start_at] = r
    last: dict[str, str] = {}
    t0 = time.time()
    with open(out / "readiness.jsonl", "a") as fh:
        while not stop.is_set() and time.time() - t0 < 1800:
            for name, r in probes.items():
                ans = r.probe()
                if last.get(name) != ans.state:
                    last[name] = ans.state
                    fh.write(json.dumps({"t": time.time(), "asked_first": name, "state": ans.state,
                                         "endpoint": ans.endpoint, "reason": ans.reason}) + "\n")
                    fh.flush()
            if all(v == "ready" for v in last.values()) and len(last) == 3:
                break
            time.sleep(1.0)


def metrics(timeout: float) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{EXPORTER_PORT}/metrics", timeout=timeout) as r:
        return r.read()


def scrape(out: Path, name: str) -> None:
    try:
        (out / f"metrics_{name}.txt").write_bytes(metrics(10))
    except OSError as exc:
        (out / f"metrics_{name}.txt").write_text(f"scrape failed: {exc}\n")


def scrape_while_running(out: Path, stage: str, stop: threading.Event) -> None:
    """Scrape every 0.5 s; keep the last scrape in which `stage` is running as
    metrics_bench.txt. The demo's bench lasts about 3 s, and the observer's
    loop sleeps 3 s for the TUI capture just as the server is ready, which is
    when bench starts (session 20's capture missed it so)."""
    running = f'eagle3_stage_status{{stage="{stage}",status="running"}} 1.0'
    while not stop.wait(0.5):
        try:
            body = metrics(5)
        except OSError:
            continue
        if running.encode() in body:
            (out / "metrics_bench.txt").write_bytes(body)


def smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
                              capture_output=True, text=True, timeout=20).stdout + \
            subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv"],
                           capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}\n"


def observe(a) -> None:
    ws, out = Path(a.ws), Path(a.out)
    tui = Tmux(ws, out)
    done: set[str] = set()
    last_sig = None
    n = 0
    stop = threading.Event()
    ready_thread = None
    t_watch_end = None
    t0 = time.time()
    try:
        while time.time() - t0 < a.max_s:
            p = cli(ws, "status", "--json")
            try:
                snap = json.loads(p.stdout)
            except ValueError:
                time.sleep(1.5)
                continue
            stages = {s["name"]: s for s in snap["stages"]}
            row = {"t": time.time(), "health": snap.get("health"),
                   "stages": {k: [s["status"], (s.get("serve") or {}).get("state"), s.get("progress"),
                                  s.get("tokens_per_s"), s.get("run_id")] for k, s in stages.items()},
                   "gpu_used": [g.get("mem_used") for g in snap.get("gpus") or []],
                   "gpu_procs": [[pr.get("pid"), pr.get("name"), pr.get("stage"), pr.get("used")]
                                 for g in snap.get("gpus") or [] for pr in g.get("processes", [])]}
            with open(out / "timeline.jsonl", "a") as fh:
                fh.write(json.dumps(row) + "\n")
            sig = tuple((k, s["status"], (s.get("serve") or {}).get("state")) for k, s in stages.items())
            if sig != last_sig:
                n += 1
                moved = [f"{k}-{st}" + (f"-{sv}" if sv else "") for k, st, sv in sig
                         if last_sig is None or (k, st, sv) not in last_sig]
                name = f"boundary_{n:02d}_" + "_".join(moved)[:120]
                (out / f"{name}.json").write_text(p.stdout)
                text = cli(ws, "status").stdout
                (out / f"{name}.txt").write_text(f"# {time.strftime('%H:%M:%S')} eagle3-console status\n{text}\n"
                                                 f"# nvidia-smi\n{smi()}")
                last_sig = sig
            ex = stages.get("extract", {})
            # Not only on progress: SGLang's first batch pays its JIT builds (~40 s), and then the
            # demo's 398 samples land within a second (session 19's capture came too late).
            running_s = time.time() - (ex.get("started") or time.time())
            # Once per extract run that lives long enough (session 20's faulting run died at 20 s,
            # before any capture; its restart was captured).
            key = f"tui_extract_run{ex.get('run_id')}"
            if key not in done and ex.get("status") == "running" and \
                    ((ex.get("progress") or 0) > 0 or running_s > 25):
                time.sleep(3.0)
                tui.capture(f"extract_run{ex.get('run_id')}")
                done.add(key)
            tr = stages.get("train", {})
            if "metrics_train" not in done and tr.get("status") == "running" and (tr.get("progress") or 0) > 0.1:
                scrape(out, "train")
                done.add("metrics_train")
            serve = next((s for s in stages.values() if s.get("serve") is not None), None)
            if serve and serve["status"] == "running" and ready_thread is None:
                ready_thread = threading.Thread(target=readiness_timeline,
                                                args=(int(serve["params"].get("port") or 30000), out, stop),
                                                daemon=True)
                ready_thread.start()
            bench = next((s for s in stages.values() if s.get("op") == "bench"), None)
            if bench and serve and "bench_scraper" not in done:
                threading.Thread(target=scrape_while_running, args=(out, bench["name"], stop), daemon=True).start()
                done.add("bench_scraper")
            if serve and (serve.get("serve") or {}).get("state") == "ready" and "tui_ready" not in done:
                time.sleep(3.0)
                tui.capture("serve_ready")
                done.add("tui_ready")
            if bench and bench["status"] == "succeeded" and "metrics_after" not in done:
                scrape(out, "after_bench")
                done.add("metrics_after")
            benches = [s for s in stages.values() if s.get("op") == "bench"]
            if benches and all(b["status"] == "succeeded" for b in benches) and "tui_ready" in done:
                break
            if benches and all(b["status"] in ("succeeded", "failed", "killed", "lost") for b in benches) \
                    and not alive(int((out / "watch.pid").read_text())):
                break
            pid = int((out / "watch.pid").read_text())
            if not alive(pid):
                t_watch_end = t_watch_end or time.time()
                if time.time() - t_watch_end > 90:     # no rescue's watch came
                    break
            else:
                t_watch_end = None
            time.sleep(1.5)
    finally:
        stop.set()
        tui.capture("last")
        tui.close()
        (out / "observer_done").write_text(f"{time.time()}\n")


# ---------------------------------------------------------------- wait

def wait(a) -> None:
    out = Path(a.out)
    t0 = time.time()
    info = json.loads((out / "start.json").read_text())
    ws = Path(info["ws"])
    last = ""
    while time.time() - t0 < a.seconds:
        if (out / "observer_done").exists():
            break
        if a.rescue_set and not alive(int((out / "watch.pid").read_text())) and not (out / "rescued").exists():
            rescue(ws, out, info, a.rescue_set)
        try:
            snap = json.loads(cli(ws, "status", "--json").stdout)
            line = " ".join(f"{s['name']}:{s['status']}" + (f"/{s['serve']['state']}" if s.get("serve") else "")
                            for s in snap["stages"])
        except ValueError:
            line = "status --json unreadable"
        if line != last:
            print(f"[{time.time() - info['t0']:6.0f}s] {line}", flush=True)
            last = line
        time.sleep(5)
    print(Path(out / "watch.log").read_text()[-3000:] if (out / "watch.log").exists() else "no watch.log")


def rescue(ws: Path, out: Path, info: dict, assignment: str) -> None:
    """watch ended before bench's result: the fault was not one the policy could halve
    (an error other than an OOM, or halving ran out). The operator's one command, then watch again."""
    snap = json.loads(cli(ws, "status", "--json").stdout)
    stages = {s["name"]: s for s in snap["stages"]}
    if all(s["status"] == "succeeded" or (s.get("serve") or {}).get("state") == "ready" for s in stages.values()):
        return
    (out / "rescued").write_text(f"{time.time()}\n")
    failed = [k for k, s in stages.items() if s["status"] in ("failed", "killed", "lost")]
    print(f"watch ended with {failed} failed: restart extract --kill --set {assignment} --yes", flush=True)
    p = cli(ws, "restart", "extract", "--kill", "--set", assignment, "--yes", timeout=120)
    (out / "rescue.txt").write_text(f"failed: {failed}\n$ restart extract --kill --set {assignment} --yes\n"
                                    f"exit {p.returncode}\n{p.stdout}{p.stderr}")
    pid = spawn([sys.executable, "-m", "eagle3_console.cli", "-w", str(ws), "watch", "--advance", "--until-done",
                 "--interval", "3"], out / "watch.log")
    (out / "watch.pid").write_text(str(pid))


# ---------------------------------------------------------------- finish

def sha_tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*.safetensors")):
        out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def finish(a) -> None:
    from eagle3_console.kernel.registry import Registry
    from eagle3_console.kernel.workspace import Workspace

    ws, out = Path(a.ws), Path(a.out)
    w = Workspace.at(ws)
    (out / "runs.txt").write_text(cli(ws, "runs", "-n", "40").stdout)
    (out / "events.txt").write_text(cli(ws, "events").stdout)
    (out / "status_final.txt").write_text(cli(ws, "status").stdout)
    (out / "status_final.json").write_text(cli(ws, "status", "--json").stdout)
    with Registry(w.db_path) as reg:
        runs = [r for r in reg.runs()]
    summary: dict = {"runs": []}
    for r in sorted(runs, key=lambda r: r.id):
        summary["runs"].append({"id": r.id, "stage": r.stage, "status": r.status, "restart_of": r.restart_of,
                                "reason": r.reason, "wall_s": round(r.ended - r.started, 1)
                                if r.ended and r.started else None, "started": r.started, "ended": r.ended,
                                "params": r.params})
    serve = [r for r in runs if r.stage.startswith("serve")]
    if serve and not a.keep_serving:
        summary["stop_serve"] = {}
        for name in sorted({r.stage for r in serve}):
            p = cli(ws, "stop", name, timeout=120)
            summary["stop_serve"][name] = (p.returncode, (p.stdout + p.stderr)[-500:])
    ex = sorted((r for r in runs if r.stage == "extract" and r.status == "succeeded"), key=lambda r: r.id)
    if ex and a.reference:
        good = ex[-1]
        argv = list(good.argv)
        ref = Path(a.reference)
        shutil.rmtree(ref, ignore_errors=True)
        argv[argv.index("--output") + 1] = str(ref)
        env = {**os.environ, **(good.env or {})}
        t = time.time()
        with open(out / "reference_extract.log", "w") as fh:
            p = subprocess.run(argv, cwd=good.cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=400)
        mine_root = Path(good.cwd) / good.params["output"] if not os.path.isabs(good.params["output"]) \
            else Path(good.params["output"])
        a_sha, b_sha = sha_tree(mine_root), sha_tree(ref)
        same = sum(1 for k, v in a_sha.items() if b_sha.get(k) == v)
        summary["sha256"] = {"reference_exit": p.returncode, "reference_s": round(time.time() - t, 1),
                             "argv": argv, "files_pipeline": len(a_sha), "files_reference": len(b_sha),
                             "identical": same, "different": sorted(k for k, v in a_sha.items()
                                                                    if k in b_sha and b_sha[k] != v)[:20],
                             "only_one_side": sorted(set(a_sha) ^ set(b_sha))[:20]}
        (out / "sha256_pipeline.json").write_text(json.dumps(a_sha, indent=0))
        (out / "sha256_reference.json").write_text(json.dumps(b_sha, indent=0))
    info = json.loads((out / "start.json").read_text())
    try:
        os.killpg(info["exporter_pid"], 15)
    except OSError:
        pass
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1, default=str)[:3000])
    for r in summary["runs"]:
        print(r["id"], r["stage"], r["status"], r["wall_s"], r["reason"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--ws", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--pipeline", required=True)
    s.add_argument("--assets", required=True)
    s.add_argument("--fault", default=None)
    s.add_argument("--interval", type=float, default=3.0)
    s.add_argument("--train-pythonpath", default=None, help="PYTHONPATH of the train and export stages")
    o = sub.add_parser("observe")
    o.add_argument("--ws", required=True)
    o.add_argument("--out", required=True)
    o.add_argument("--watch-pid", type=int, required=True, help="the first watch (a rescue's is in OUT/watch.pid)")
    o.add_argument("--max-s", type=float, default=2400)
    w = sub.add_parser("wait")
    w.add_argument("--out", required=True)
    w.add_argument("--seconds", type=float, required=True)
    w.add_argument("--rescue-set", default="mem_fraction_static=0.3")
    r = sub.add_parser("resume")
    r.add_argument("--ws", required=True)
    r.add_argument("--out", required=True)
    f = sub.add_parser("finish")
    f.add_argument("--ws", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--reference", default=None, help="re-run the succeeded extract's argv into this folder")
    f.add_argument("--keep-serving", action="store_true")
    a = ap.parse_args()
    {"start": start, "resume": resume, "observe": observe, "wait": wait, "finish": finish}[a.cmd](a)


if __name__ == "__main__":
    main()
