"""The spool of streamed online training: a folder of hidden-state sample files
with a byte cap, written by an extract run (the producer) and consumed, then
deleted, by a train run (the consumer). For targets that need an engine of
their own (SGLang with TP/EP): the states of an epoch never all sit on disk.

Where it sits: below the stages; ops/extract/spool_producer.py and
ops/train/streamed.py import it, the console reads its records through the
train stage's metrics (ops/train/spec.py). No torch.

The folder is extract's layout (DESIGN.md: rows_<a>-<b>/data_<idx>.safetensors,
each file whole once it has its name) plus three records, each replaced whole
(written to a temp file, then renamed):

    spool.json     the consumer's claim: its run token, what it trains on (prepare's
                   samples, the target, the aux layer ids), the byte cap and what is kept
    need.json      the consumer's plan: the batches it reads next (`groups` of sample
                   ids), in order, from an epoch's position; `seq` grows with each new
                   plan; `done` at the end
    read.json      the consumer's place in its plan: how many of the plan's batches it read
                   (a restarted producer starts there, not at the plan's beginning)
    producer.json  the producer's heartbeat: state (producing / blocked / waiting),
                   its tok/s, the time it spent blocked at the watermark, pid, time

The protocol: the consumer writes need.json at every epoch (and at a resume,
from its checkpoint's position); the producer extracts the plan's samples in
its order that are not on disk, and blocks while the spool's bytes, what its
writers still hold and the next batch would pass the cap (the high
watermark), until the consumer has read the spool down to the low watermark.
The consumer deletes a sample once read, except the ones it keeps (the
held-out samples, and with `keep_bytes` the first samples by id that fit it:
those are extracted once and read every epoch). A consumer that dies leaves
files that are whole or absent; its resume writes a new plan and the producer
re-extracts what is missing. A producer that dies leaves the same; the
consumer waits, saying so.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops import hidden_formats
from ops.formats import SAMPLE_RE, SHARD_DIR_RE, sample_path

SPOOL_FILE = "spool.json"
NEED_FILE = "need.json"
PRODUCER_FILE = "producer.json"
READ_FILE = "read.json"
# The low watermark, a share of the cap: a blocked producer resumes once the consumer read the spool down to it.
LOW_SHARE = 0.5
# A producer heartbeat older than this is a producer that is gone (it writes one every second at least).
STALE_S = 30.0
# A sample file's bytes besides its states: the ids (int64), the mask (uint8), the header.
_HEADER_SLACK = 4096


class SpoolError(ValueError):
    """One line for the operator: the spool, the key, what was expected."""


def sample_bytes(tokens: int, hidden: int, fmt: str, dtype_bytes: int, states: int = 4) -> int:
    """An upper bound of one sample file's size in the spool."""
    return hidden_formats.state_bytes(fmt, tokens, states, hidden, dtype_bytes) + 9 * tokens + _HEADER_SLACK


def spool_files(root: Path) -> dict[int, Path]:
    """idx -> sample file, for the whole files in the spool (temp files are the writers' own)."""
    out: dict[int, Path] = {}
    root = Path(root)
    if not root.is_dir():
        return out
    with os.scandir(root) as shards:
        for shard in shards:
            if not (shard.is_dir() and SHARD_DIR_RE.match(shard.name)):
                continue
            with os.scandir(shard.path) as files:
                for f in files:
                    m = SAMPLE_RE.match(f.name)
                    if m and m.group(2) == "safetensors":
                        out[int(m.group(1))] = Path(f.path)
    return out


def spool_bytes(root: Path) -> int:
    """Bytes of the spool's sample files on disk, temp files included (they are on the disk too)."""
    total = 0
    root = Path(root)
    if not root.is_dir():
        return 0
    with os.scandir(root) as shards:
        for shard in shards:
            if shard.is_dir() and SHARD_DIR_RE.match(shard.name):
                with os.scandir(shard.path) as files:
                    for f in files:
                        try:
                            total += f.stat().st_size
                        except FileNotFoundError:
                            pass        # read and deleted by the consumer meanwhile
    return total


def write_record(root: Path, name: str, record: dict) -> None:
    path = Path(root) / name
    tmp = path.with_name(f"{name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def read_record(root: Path, name: str) -> dict | None:
    """The record, or None when absent; SpoolError when it is not a JSON object."""
    path = Path(root) / name
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SpoolError(f"{path}: not a readable JSON record ({exc})") from None
    if not isinstance(value, dict):
        raise SpoolError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Claim:
    """spool.json: who consumes this spool and what it trains on."""

    consumer: str            # the train run's token (ops/drafter/checkpoint.py RunMark)
    samples: str             # prepare's output, resolved
    total_tokens: int
    target: str              # the target's folder, resolved
    layer_ids: list[int]
    hidden_size: int
    keep: list[int]          # sample ids the consumer keeps across epochs (held out, keep_bytes)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def check_claim(root: Path, claim: Claim, resume: bool) -> None:
    """The consumer's claim on `root`: refused when the folder is no spool (an
    extraction the consumer would delete), or the spool belongs to another run."""
    from ops.formats import DATA_CONFIG

    root = Path(root)
    existing = read_record(root, SPOOL_FILE)
    if existing is None:
        if (root / DATA_CONFIG).exists() and (read_record(root, DATA_CONFIG) or {}).get("status") != "spool":
            raise SpoolError(f"spool {root}: holds another extraction ({root / DATA_CONFIG}), not a spool; the "
                             f"consumer deletes what it reads: name an empty folder")
        return
    owner = existing.get("consumer")
    # A resumed run keeps its token (ops/train/owner.py), so only the run that claimed the spool passes.
    if owner != claim.consumer:
        raise SpoolError(f"spool {root}: owned by train run {owner} ({root / SPOOL_FILE}); this run is "
                         f"{claim.consumer}" + ("" if resume else ": resume that run (resume=true)") +
                         ", delete the spool's folder, or use another spool")


def check_producer(root: Path, layer_ids: list[int], target: str, samples: str, total_tokens: int) -> dict:
    """What the producer checks against the consumer's claim before its first
    batch: the same aux layers, target and samples, named both ways."""
    claim = read_record(root, SPOOL_FILE)
    if claim is None:
        raise SpoolError(f"spool {root}: no {SPOOL_FILE} yet")
    wrong = []
    if [int(x) for x in claim.get("layer_ids", [])] != list(layer_ids):
        wrong.append(f"layer_ids: the consumer trains on {claim.get('layer_ids')}, this producer captures "
                     f"{list(layer_ids)}")
    if claim.get("target") != target:
        wrong.append(f"target: the consumer's is {claim.get('target')}, this producer's {target}")
    if claim.get("samples") != samples or claim.get("total_tokens") != total_tokens:
        wrong.append(f"samples: the consumer reads {claim.get('samples')} ({claim.get('total_tokens')} tokens), "
                     f"this producer {samples} ({total_tokens} tokens)")
    if wrong:
        raise SpoolError(f"spool {root}: the producer and the consumer ({root / SPOOL_FILE}) differ: "
                         + "; ".join(wrong))
    return claim


def heartbeat_age(record: dict | None, now: float | None = None) -> float | None:
    if not record or not isinstance(record.get("time"), (int, float)):
        return None
    return (time.time() if now is None else now) - float(record["time"])


def fill_words(used: int, cap: int) -> str:
    from ops.units import human_bytes

    return f"{human_bytes(used)} of {human_bytes(cap)} ({100 * used / cap:.0f} %)" if cap else human_bytes(used)


def path_of(root: Path, idx: int) -> Path:
    return sample_path(Path(root), idx)


def plan_record(seq: int, epoch: int, position: int, groups: list[list[int]], keep: list[int],
                done: bool = False, first: list[int] | None = None) -> dict:
    """need.json: the consumer's batches (`groups`, each read whole) in the order it reads them;
    `first`: kept samples not on the spool yet, made before the batches (the held-out walk reads them)."""
    return {"seq": seq, "epoch": epoch, "position": position, "first": first or [], "groups": groups,
            "keep": keep, "done": done, "time": time.time()}


def groups_read(root: Path, seq: int) -> int:
    """How many of plan `seq`'s batches the consumer has read (0 when read.json is of another plan)."""
    try:
        record = read_record(root, READ_FILE)
    except SpoolError:
        return 0
    if not record or record.get("seq") != seq or not isinstance(record.get("read"), int):
        return 0
    return max(0, record["read"])


def as_int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise SpoolError(f"{where}: expected a list of sample ids")
    return value
