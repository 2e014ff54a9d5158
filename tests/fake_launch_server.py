"""A fake `python -m sglang.launch_server` for the serve stage end to end on CPU.

It takes SGLang's argv (only --model-path, --host, --port, --tp-size,
--speculative-algorithm are used), prints the lines sglang 0.5.23 prints
while it starts (strings from its source: model_executor/model_runner.py
"Load weight begin/end", model_loader/weight_utils.py's tqdm bar
"Loading safetensors checkpoint shards" in utils/common.py's BAR_FORMAT,
entrypoints/http_server.py "The server is fired up and ready to roll!", the
log format "[%Y-%m-%d %H:%M:%S TPn] ..." of utils/common.py configure_logger),
and serves tests/sglang_double.py's endpoints: port closed while "loading",
/ready 503 while warming up, 200 once fired up. The warm-up is SGLang's own
(entrypoints/http_server.py _execute_server_warmup, the same in 0.5.17 and
0.5.23): poll /model_info until 200, send one /generate (the first forward,
which compiles the kernels), set the status Up, log "fired up".

Environment knobs: FAKE_SGLANG_LOAD_S (weight loading, default 1.5 s),
FAKE_SGLANG_WARMUP_S (the warm-up request's first forward: port open, not
ready; default 0.5 s), FAKE_SGLANG_LOAD_UNTIL=FILE (loading goes on until FILE
exists: a test's event instead of a duration), FAKE_SGLANG_VERSION=0.5.17 (that release's server: no
/ready route, see tests/sglang_double.py), FAKE_SGLANG_FAIL=oom
(after loading: the scheduler's KV-pool RuntimeError of
model_executor/pool_configurator.py, the sigquit line of entrypoints/engine.py,
exit 1); FAKE_SGLANG_ORPHANS=1 with it leaves the worker children running, as a
TP worker that outlives its server does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from tests.sglang_double import VERSION, Double


def stamp(tp: int | None = None) -> str:
    return "[" + time.strftime("%Y-%m-%d %H:%M:%S") + (f" TP{tp}" if tp is not None else "") + "]"


def say(line: str, end: str = "\n") -> None:
    sys.stdout.write(line + end)
    sys.stdout.flush()


def warm_up(url: str) -> None:
    """_execute_server_warmup's steps, against this server's own port."""
    for _ in range(120):
        try:
            with urllib.request.urlopen(url + "/model_info", timeout=5) as resp:
                if resp.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    body = json.dumps({"text": "The capital city of France is",
                       "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        resp.read()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default="/models/target")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--dp-size", type=int, default=1)
    ap.add_argument("--speculative-algorithm", default=None)
    ap.add_argument("--mem-fraction-static", type=float, default=None)
    args, _rest = ap.parse_known_args()
    load_s = float(os.environ.get("FAKE_SGLANG_LOAD_S", "1.5"))
    warmup_s = float(os.environ.get("FAKE_SGLANG_WARMUP_S", "0.5"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    # SGLang's scheduler / TP worker processes are children of launch_server (one per
    # rank); here they only sleep, so that stop and kill-workers have children to reach.
    workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
               for _ in range(args.tp_size * args.dp_size)]
    say(f"{stamp(0)} Load weight begin. avail mem=94.10 GB")
    shards = 4
    for i in range(shards + 1):
        pct = 100 * i / shards
        say(f"Loading safetensors checkpoint shards: {pct:3.0f}% Completed | {i}/{shards} "
            f"[00:0{i}<00:0{shards - i}, 1.00it/s]", end="\r" if i < shards else "\n")
        if i < shards:
            time.sleep(load_s / shards)
    until = os.environ.get("FAKE_SGLANG_LOAD_UNTIL")
    while until and not os.path.exists(until):      # loading until the test says (no fixed window)
        time.sleep(0.05)
    say(f"{stamp(0)} Load weight end. elapsed={load_s:.2f} s, type=DeepseekV3ForCausalLM, "
        f"avail mem=4.02 GB, mem usage=90.08 GB.")
    if os.environ.get("FAKE_SGLANG_FAIL") == "oom":
        mfs = args.mem_fraction_static if args.mem_fraction_static is not None else 0.95
        say(f"{stamp(0)} Scheduler hit an exception: Traceback (most recent call last):")
        say('  File "/opt/sglang/python/sglang/srt/managers/scheduler.py", line 6363, in run_scheduler_process')
        say("    scheduler = Scheduler(server_args, port_args)")
        say('  File "/opt/sglang/python/sglang/srt/model_executor/pool_configurator.py", line 99, in __post_init__')
        say("    raise RuntimeError(msg)")
        say("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={mfs}")
        say("")
        say(f"{stamp()} Received sigquit from a child process. It usually means the child failed.")
        if os.environ.get("FAKE_SGLANG_ORPHANS") != "1":    # else: workers outlive the server
            for w in workers:
                w.kill()
        return 1
    version = os.environ.get("FAKE_SGLANG_VERSION", VERSION)
    double = Double(host=args.host, port=args.port, speculative=bool(args.speculative_algorithm),
                    tp=args.tp_size, dp=args.dp_size, model_path=args.model_path, version=version,
                    ready_route=version != "0.5.17", first_forward_s=warmup_s).start()
    say(f"{stamp()} INFO:     Uvicorn running on http://{args.host}:{double.port} (Press CTRL+C to quit)")
    warm_up(double.url)
    double.status = "Up"
    say(f"{stamp()} The server is fired up and ready to roll!")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
