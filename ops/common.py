"""Small helpers shared by the stage programs (ops/<stage>/__main__.py).

Sits at the very start of the data flow: a stage program parses its flags,
does its work and reports through its exit code and log lines, which the
console's runs and log monitors read. Nothing here imports torch at import time.

- BadInput + run_main(): the exit-code contract (0 ok, 2 bad input with a
  message that names the file/line/key, 1 any other failure);
- write_json_atomic(): a file that exists is whole (temp name, then rename);
- unvouched_files(): the partial leftovers of a payload and the record that vouches for it;
- count(): a non-negative integer from a param, a config or a summary, or None;
- wants_cuda(): whether a stage's `device` (auto | cpu | cuda) puts its work on CUDA;
- progress(): tqdm lines (`N/M [elapsed<eta, X it/s]`) the log monitor parses.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, NoReturn, Sequence

# The console's supervisor holds this file in each output folder of a live run
# (eagle3_console/runs/claims.py): an op that owns its folder whole leaves it alone.
CLAIM_FILE = ".eagle3-lock"

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2

# A full disk, or a quota: every later write fails the same way (extract's writers, train's
# checkpoints, regenerate's journal stop on it and say the file in one line).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full_text(exc: OSError, where: Path | str) -> str:
    """`<file>: No space left on device (ENOSPC)`: the file the error names, else `where`."""
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return f"{exc.filename or where}: {exc.strerror or os.strerror(exc.errno or 0)} ({name})"
TMP_SUFFIX = ".tmp"

Coords = tuple[int, int, int]       # (rank, world size, local rank)


def torchrun_coords() -> Coords:
    """This process's place under torchrun (RANK, WORLD_SIZE, LOCAL_RANK); a world of one without it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return rank, world, int(os.environ.get("LOCAL_RANK", str(rank)))


class BadInput(Exception):
    """The operator's input is wrong (a file, a line, a key): exit 2 with this message."""


def run_main(main: Callable[[Sequence[str] | None], int | None],
             argv: Sequence[str] | None = None, prog: str | None = "op") -> int:
    """Run a stage's main() under the exit-code contract and return the code.

    BadInput -> 2 (or its own exit_code: a BadFormat's 3) with its message on stderr (`<prog>: error: ...`, or the
    bare `error: ...` line train, export and bench have always written when
    `prog` is None); KeyboardInterrupt -> 130; anything else -> 1 with the
    traceback (the log monitor recognises it).
    """
    head = f"{prog}: " if prog else ""
    try:
        code = main(argv)
    except BadInput as exc:
        print(f"{head}error: {exc}", file=sys.stderr, flush=True)
        return getattr(exc, "exit_code", EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        print(f"{head}interrupted", file=sys.stderr, flush=True)
        return 130
    except SystemExit as exc:  # argparse exits 2 on bad flags; keep its code
        return exc.code if isinstance(exc.code, int) else EXIT_FAILURE
    except Exception:  # noqa: BLE001 - the contract: any other failure is exit 1
        traceback.print_exc()
        return EXIT_FAILURE
    return EXIT_OK if code is None else int(code)


def exit_program(code: int) -> NoReturn:
    """A stage program's end with `code`. A torchrun rank (WORLD_SIZE > 1) leaves through
    os._exit once its streams are flushed: its outputs are written and closed and its process
    group left by then, and what the interpreter's exit would still tear down is torch's C++
    distributed runtime. That teardown aborted rank 1 after complete runs (SIGABRT, "terminate
    called without an active exception": extract's SGLang engine, then train's DDP, in CI), and
    torchrun then failed the whole run; pytorch/pytorch#179291 describes the mechanism (gloo's
    threads holding work whose tensors are freed during finalization). One process exits as usual."""
    if torchrun_coords()[1] > 1:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to `path` through a temp name so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def wants_cuda(device: str) -> bool:
    """A stage's `device` param: "cuda" asks for CUDA, "auto" takes it where this machine has it."""
    if device == "cuda":
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def count(value: Any) -> int | None:
    """A non-negative integer from a param, a config or a summary; None for
    anything else (a bool, a string that is no number, a negative)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 and not isinstance(value, bool) else None


def read_json(path: Path) -> dict | None:
    """The JSON object at `path`, or None when absent or unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def unvouched_files(root: Path, record: str, payload: str) -> list[Path]:
    """Partial files of an op that writes one payload file and then a JSON record
    saying `"status": "complete"` (prepare: samples + summary; vocab: mapping +
    vocab.json): its temp files, and the payload when no complete record vouches
    for it."""
    if not root.is_dir():
        return []
    out = sorted(p for p in root.iterdir() if p.name.endswith(TMP_SUFFIX) and p.is_file())
    complete = (read_json(root / record) or {}).get("status") == "complete"
    if not complete and (root / payload).is_file():
        out.append(root / payload)
    return out


def load_json_file(path: Path, error: type[Exception], missing_hint: str) -> Any:
    """The JSON at `path`, or `error` naming the file and saying what was expected."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"{path}: missing; {missing_hint}") from None
    except ValueError as exc:
        raise error(f"{path}: not JSON ({exc})") from None


def progress(iterable: Iterable | None = None, total: int | None = None,
             desc: str = "", unit: str = "it", mininterval: float = 1.0, **kw: Any):
    """A tqdm bar writing plain ASCII lines to stdout (the run's log).

    Each refresh ends with a newline rather than tqdm's carriage return, so
    a log tail shows every update as its own `N/M [..., X it/s]` line.
    """
    from tqdm import tqdm  # a dependency of transformers; imported late to keep specs light

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=_LineWriter(sys.stdout),
                ascii=True, mininterval=mininterval, dynamic_ncols=False, ncols=100, **kw)


class _LineWriter:
    """tqdm writes `\\r<line>`; turn each refresh into `<line>\\n` for log files."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        text = text.replace("\r", "")
        if text.strip():
            self._stream.write(text.rstrip("\n") + "\n")
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


def resolve_target_vocab(target: str | None) -> int | None:
    """vocab_size from `<target>/config.json` (or its text_config), None when absent."""
    if not target:
        return None
    cfg = read_json(Path(target) / "config.json")
    if not cfg:
        return None
    for holder in (cfg, cfg.get("text_config") or {}, cfg.get("language_config") or {}):
        if isinstance(holder, dict) and isinstance(holder.get("vocab_size"), int):
            return int(holder["vocab_size"])
    return None
