"""Streamed online training: the consumer of a spool (ops/spool.py) that an
extract run fills, for a target that needs an engine of its own (SGLang with
TP/EP). Each epoch's plan goes to the producer (need.json); each batch is read
from the spool once its files are there, then deleted (but the kept ones: the
held-out samples and, with keep_bytes, the first samples by id that fit).

Where it sits: ops/train/loop.py reads a StreamedData where it reads offline's
DataInfo or online's OnlineData (the same fields, the same batches, order and
held-out split: prepare's lengths and the seed), so the three modes train the
same drafter up to the target's numerics. The window record (`online`) carries
both sides: the producer's heartbeat (its tok/s, the share of the window it was
blocked at the watermark), the share the drafter waited, the spool's fill.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops import hidden_formats
from ops import spool as sp
from ops.drafter.data import BatchDataset
from ops.train.online import BOUND_WAIT_SHARE

POLL_S = 0.05
# A consumer waiting for its batch says so at once and then this often (never a hang without a word).
SAY_EVERY_S = 10.0


@dataclass
class StreamedData:
    root: Path                      # the spool
    hidden_size: int
    layer_ids: list[int]
    final_post_norm: bool
    config: dict
    samples: dict[int, Path]        # idx -> its file in the spool (absent until produced)
    lengths: dict[int, int]
    prepared: Any
    keep_bytes: int = 0
    format: str = hidden_formats.DEFAULT
    keep: set = field(default_factory=set)
    held: set = field(default_factory=set)
    seq: int = 0
    read: int = 0
    waited_s: float = 0.0
    log: Any = print
    _beat: dict = field(default_factory=dict)

    def describe(self) -> str:
        return f"streamed: states from the spool {self.root} (layers {self.layer_ids})"

    def dataset(self, batches: list[list[int]], max_len: int, bucket: int = 0, token_budget: int = 0):
        return SpoolBatches(self, batches, max_len, bucket, token_budget)

    # ---- the claim, the plans, the end
    def claim(self, token: str, train_ids: list[int], held: list[int], resume: bool) -> None:
        """spool.json for this run (refused when another run holds the spool),
        the kept samples, the strays of an earlier plan gone, the producer's
        data_config waited for (its format is how the files are read)."""
        from ops.drafter.data import DataError

        keep, used = set(held), 0
        for idx in sorted(train_ids):
            cost = sp.sample_bytes(self.lengths[idx], self.hidden_size, self.format, 2)
            if used + cost > self.keep_bytes:
                break
            keep.add(idx)
            used += cost
        self.keep, self.held = keep, set(held)
        claim = sp.Claim(consumer=token, samples=self.config["samples"], total_tokens=sum(self.lengths.values()),
                         target=self.config["target"], layer_ids=self.layer_ids, hidden_size=self.hidden_size,
                         keep=sorted(keep))
        try:
            sp.check_claim(self.root, claim, resume)
        except sp.SpoolError as exc:
            raise DataError(str(exc)) from None
        self.root.mkdir(parents=True, exist_ok=True)
        sp.write_record(self.root, sp.SPOOL_FILE, claim.to_dict())
        # A resume re-plans from its checkpoint: what an earlier plan left is extracted again if needed.
        stray = [p for idx, p in sp.spool_files(self.root).items() if idx not in keep]
        for path in stray:
            path.unlink(missing_ok=True)
        if stray:
            self.log(f"streamed: {len(stray)} sample file(s) of an earlier plan removed from the spool")
        previous = self._read_need()
        self.seq = int(previous.get("seq", 0)) if previous else 0

    def wait_for_producer_config(self) -> None:
        """The producer's data_config.json (status "spool"): the format, and its layers checked against ours."""
        from ops.drafter.data import DataError
        from ops.formats import DATA_CONFIG

        said = 0.0
        t0 = time.monotonic()
        while True:
            config = None
            try:
                config = sp.read_record(self.root, DATA_CONFIG)
            except sp.SpoolError:
                pass
            if config is not None and config.get("status") == "spool":
                ids = [int(x) for x in config.get("layer_ids", [])]
                if ids != self.layer_ids or int(config.get("hidden_size", -1)) != self.hidden_size:
                    raise DataError(f"spool {self.root}: its producer writes layers {ids}, hidden "
                                    f"{config.get('hidden_size')} ({self.root / DATA_CONFIG}); this run trains on "
                                    f"layers {self.layer_ids}, hidden {self.hidden_size}")
                self.format = hidden_formats.config_format(config, str(self.root / DATA_CONFIG))
                self.waited_s += time.monotonic() - t0
                return
            said = self._say_waiting(said, "its data_config.json (no producer has started yet?)")
            time.sleep(POLL_S)

    def begin_epoch(self, epoch: int, position: int, batches: list[list[int]]) -> None:
        """need.json: this epoch's batches from `position` on, in the order they are read; the kept
        samples not yet on the spool first (the held-out walk reads them at the first window)."""
        missing = [i for i in sorted(self.keep) if i not in sp.spool_files(self.root)]
        self.seq += 1
        self.read = 0
        sp.write_record(self.root, sp.READ_FILE, {"seq": self.seq, "read": 0})
        sp.write_record(self.root, sp.NEED_FILE,
                        sp.plan_record(self.seq, epoch, position, [list(b) for b in batches], sorted(self.keep),
                                       first=missing))

    def finish(self) -> None:
        self.seq += 1
        sp.write_record(self.root, sp.NEED_FILE, sp.plan_record(self.seq, -1, 0, [], sorted(self.keep), done=True))

    def _read_need(self) -> dict | None:
        try:
            return sp.read_record(self.root, sp.NEED_FILE)
        except sp.SpoolError:
            return None

    def producer(self) -> dict | None:
        try:
            return sp.read_record(self.root, sp.PRODUCER_FILE)
        except sp.SpoolError:
            return None

    def _say_waiting(self, said: float, what: str) -> float:
        now = time.monotonic()
        if said and now - said < SAY_EVERY_S:
            return said
        beat = self.producer()
        age = sp.heartbeat_age(beat)
        if beat is None:
            who = "no producer has written a heartbeat yet"
        elif age is not None and age > sp.STALE_S:
            who = (f"no producer alive (its last heartbeat {age:.0f} s ago, state {beat.get('state')}); the "
                   f"console's restart policy restarts it, or start the extract stage")
        else:
            who = f"the producer is {beat.get('state')}"
        self.log(f"streamed: waiting for the producer: {what}; {who}")
        return now

    # ---- the window's record
    def window(self, elapsed: float, waited: float, tokens: int) -> dict:
        beat = self.producer() or {}
        blocked = float(beat.get("blocked_s") or 0.0)
        blocked_share = (min(1.0, max(0.0, blocked - self._beat.get("blocked_s", blocked)) / elapsed)
                         if self._beat else 0.0)
        self._beat = {"blocked_s": blocked}
        wait_share = min(1.0, waited / elapsed)
        used, cap = sp.spool_bytes(self.root), beat.get("cap")
        return {"target_tok_s": beat.get("tok_s"), "drafter_tok_s": round(tokens / max(1e-9, elapsed - waited), 1),
                "waited_s": round(waited, 3), "wait_share": round(wait_share, 4),
                "producer_state": beat.get("state"), "producer_blocked_share": round(blocked_share, 4),
                "spool_bytes": used, "spool_cap": cap,
                "bound": "target" if wait_share >= BOUND_WAIT_SHARE else "drafter"}


class SpoolBatches(BatchDataset):
    """Item i = batch i, read from the spool once its files are there (as a batch read from an
    extraction is); deleted once read unless kept."""

    def __getitem__(self, i: int) -> dict:
        data = self.info
        idxs = self.batches[i]
        paths = [data.samples[idx] for idx in idxs]
        t0, said = time.monotonic(), 0.0
        while True:
            missing = [idx for idx, p in zip(idxs, paths) if not p.exists()]
            if not missing:
                break
            said = data._say_waiting(said, f"{len(missing)} of this batch's {len(idxs)} samples are not in the "
                                           f"spool yet (first: {missing[0]})")
            time.sleep(POLL_S)
        data.waited_s += time.monotonic() - t0
        batch = super().__getitem__(i)
        for idx, p in zip(idxs, paths):
            if idx not in data.keep:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        if not all(idx in data.held for idx in idxs):
            # One of the plan's batches read (the held-out walk's are not the plan's): where a
            # restarted producer starts.
            data.read += 1
            sp.write_record(data.root, sp.READ_FILE, {"seq": data.seq, "read": data.read})
        return batch


def open_streamed(args, head_vocab_size: int | None, log) -> StreamedData:
    """prepare's samples and the target's config (as online), and the spool named."""
    from ops.common import BadInput
    from ops.train.online import open_online

    if not args.spool:
        raise BadInput("mode streamed needs spool (the folder an extract run with spool_bytes fills: --spool)")
    online = open_online(args, head_vocab_size)
    root = Path(args.spool)
    config = dict(online.config, mode="streamed", spool=str(root.resolve()))
    return StreamedData(root=root, hidden_size=online.hidden_size, layer_ids=online.layer_ids,
                        final_post_norm=True, config=config,
                        samples={i: sp.path_of(root, i) for i in online.lengths}, lengths=online.lengths,
                        prepared=online.prepared, keep_bytes=int(args.keep_bytes or 0), log=log)
