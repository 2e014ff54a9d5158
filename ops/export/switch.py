"""One switch for the whole export: a reader sees the old export or the new one, never a mix.

export builds the new sglang/, speculators/ and export_info.json in
`<output>.tmp-<pid>` beside the output (same filesystem), fsyncs it, then
switches: renameat2(RENAME_EXCHANGE) swaps the two folders in one step (ext4,
xfs, btrfs, tmpfs); where the filesystem lacks it (NFS, some FUSE) the old
folder is renamed to `<output>.old-<pid>` and the new one in, a window of
two renames in which the output is absent. The replaced export is deleted
last. A kill -9 anywhere leaves at most those two names; the next export
starts by finishing or rolling back (`recover`): a staging folder is
deleted (its run did not end), an old folder is deleted when the output is
there, renamed back when it is not.

The output folder is export's alone: it refuses one holding anything but
what it writes, since the switch replaces the folder whole.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import signal
from pathlib import Path

from ops.drafter import diskio
from ops.common import CLAIM_FILE
from ops.drafter.formats import INFO_FILE, SGLANG_DIR, SPECULATORS_DIR

# Test hooks: stop (SIGSTOP) at a point of the switch so that a test can kill -9
# exactly there (points: built, aside, switched); "no-exchange" forces the two-rename path.
TEST_STOP_ENV = "EAGLE3_EXPORT_TEST_STOP_AT"
TEST_MODE_ENV = "EAGLE3_EXPORT_TEST_MODE"
OURS = frozenset({SGLANG_DIR, SPECULATORS_DIR, INFO_FILE})
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


class SwitchError(ValueError):
    """One line for the operator; export exits 2."""


def real_output(out: Path) -> Path:
    """The folder to switch: an output that is a symlink is switched where it points."""
    out = Path(os.path.abspath(out))
    return Path(os.path.realpath(out)) if out.is_symlink() else out


def staging_dir(out: Path) -> Path:
    return out.with_name(f"{out.name}.tmp-{os.getpid()}")


def _aside_dir(out: Path) -> Path:
    return out.with_name(f"{out.name}.old-{os.getpid()}")


def _hook(point: str) -> None:
    if os.environ.get(TEST_STOP_ENV) == point:
        os.kill(os.getpid(), signal.SIGSTOP)


def _leftovers(out: Path) -> list[tuple[str, int, Path]]:
    pat = re.compile(rf"^{re.escape(out.name)}\.(tmp|old)-(\d+)$")
    if not out.parent.is_dir():
        return []
    found = []
    for p in out.parent.iterdir():
        m = pat.match(p.name)
        if m:
            found.append((m.group(1), int(m.group(2)), p))
    return sorted(found, key=lambda t: (t[0], t[1]))


def _export_alive(pid: int) -> bool:
    import psutil

    if pid == os.getpid():
        return False
    try:
        return "ops.export" in " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def recover(out: Path, log) -> None:
    """Finish or roll back what an export killed mid-way left beside `out`."""
    items = _leftovers(out)
    for _kind, pid, path in items:
        if _export_alive(pid):
            raise SwitchError(f"{path}: another export (pid {pid}) is writing {out}; wait for it or stop it")
    olds = [p for kind, _, p in items if kind == "old"]
    if olds and not out.exists():
        back = olds.pop()
        os.rename(back, out)
        diskio.fsync_dir(out.parent)
        log(f"export: rolled back an interrupted switch: {back} -> {out}")
    for path in olds:
        shutil.rmtree(path)
        log(f"export: removed the export it replaced, left by an interrupted switch: {path}")
    for kind, _, path in items:
        if kind == "tmp":
            shutil.rmtree(path)
            log(f"export: removed an interrupted export's staging folder {path}")


def check_output(out: Path) -> None:
    """`out` absent, or a folder of what export writes (and the old format temp dirs)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SwitchError(f"{out}: not a folder; export writes a folder there (sglang/, speculators/, {INFO_FILE})")
    foreign = sorted(p.name for p in out.iterdir()
                     if p.name not in OURS and p.name != CLAIM_FILE and ".tmp-" not in p.name)
    if foreign:
        raise SwitchError(f"{out} holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}, which export "
                          f"did not write; a re-export replaces the folder whole: move them out or choose "
                          f"another --output")


def _sync_tree(root: Path) -> None:
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
        diskio.fsync_dir(Path(dirpath))


def _exchange(a: Path, b: Path) -> bool:
    """renameat2(a, b, RENAME_EXCHANGE); False where the libc or filesystem lacks it."""
    if os.environ.get(TEST_MODE_ENV) == "no-exchange":
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def commit(out: Path, stage: Path) -> None:
    """Put the whole staged export at `out`, then delete the one it replaces."""
    _sync_tree(stage)
    diskio.fsync_dir(out.parent)
    _hook("built")
    if not out.exists():
        os.rename(stage, out)
        diskio.fsync_dir(out.parent)
        return
    aside = _aside_dir(out)
    if _exchange(stage, out):
        diskio.fsync_dir(out.parent)
        os.rename(stage, aside)          # the staging name now holds the old export
    else:
        os.rename(out, aside)
        diskio.fsync_dir(out.parent)
        _hook("aside")
        os.rename(stage, out)
    diskio.fsync_dir(out.parent)
    _hook("switched")
    shutil.rmtree(aside)
