"""extract as the producer of a spool (ops/spool.py): the consumer's plan in,
its samples' states out, never more than the spool's byte cap on disk.

Where it sits: run.py's _extract hands the opened run here when `spool_bytes`
is set; the engine, the target and the forward loop (loop.py: batches, file
images, writers) are extract's own, driven with the consumer's order instead
of the longest-first plan, and a gate before each batch that blocks at the
high watermark. The target is loaded once and serves every epoch's plan.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ops.common import EXIT_OK, BadInput
from ops.extract.loop import Loop, log
from ops.spec import dtype_bytes
from ops import spool as sp

# How often a waiting side looks again, and writes its heartbeat at least.
POLL_S = 0.05
BEAT_S = 1.0


class Producer:
    def __init__(self, run, engine, placement_fn) -> None:
        self.run, self.engine, self.placement_fn = run, engine, placement_fn
        self.root = Path(run.out_dir)
        args = run.args
        self.cap = int(args.spool_bytes)
        self.low = int(self.cap * sp.LOW_SHARE)
        self.fmt = run.config["format"]
        hidden, width = run.info.hidden_size, dtype_bytes(run.dtype)
        self.est = [sp.sample_bytes(n, hidden, self.fmt, width) for n in run.lengths]
        self.lock = threading.Lock()
        self.pending: dict[int, int] = {}        # submitted to the writers, not yet named
        self.seq = None
        self.blocked_s = 0.0
        self.tokens = 0
        self.t0 = time.monotonic()
        self.state = "starting"
        self.last_beat = 0.0
        self.target = None
        self.heads: dict[tuple, list[int]] = {}      # a group's first forward batch -> the group

    # ---- the heartbeat (producer.json), read by the consumer and, through its records, the console
    def beat(self, state: str, force: bool = False, **extra) -> None:
        now = time.monotonic()
        if not force and state == self.state and now - self.last_beat < BEAT_S:
            return
        self.state, self.last_beat = state, now
        elapsed = max(1e-9, now - self.t0)
        sp.write_record(self.root, sp.PRODUCER_FILE, {
            "state": state, "pid": os.getpid(), "time": time.time(), "cap": self.cap,
            "low": self.low, "tokens": self.tokens, "tok_s": round(self.tokens / elapsed, 1),
            "blocked_s": round(self.blocked_s, 3), "elapsed_s": round(elapsed, 3), "seq": self.seq, **extra})

    def produce(self) -> int:
        self.root.mkdir(parents=True, exist_ok=True)
        # No totals: a spool's files come and go, so the console counts no progress from them.
        config = {k: v for k, v in self.run.config.items() if k not in ("total_samples", "total_tokens")}
        config.update(status="spool", spool_bytes=self.cap)
        from ops.extract import output

        output.write_data_config(self.root, config)
        claim = self._claim()
        # The kept samples (held out, keep_bytes) stay on the spool: the watermarks move above them.
        kept = sum(self.est[i] for i in claim.get("keep") or [] if 0 <= i < len(self.est))
        self.low = kept + int((self.cap - kept) * sp.LOW_SHARE)
        biggest = max(self.est) if self.est else 0
        if biggest > self.cap - self.low:
            raise BadInput(f"spool_bytes {self.cap}: beside the {kept} bytes the consumer keeps (held-out samples, "
                           f"keep_bytes) the spool cannot hold the largest sample ({biggest} bytes at most, "
                           f"{max(self.run.lengths)} tokens) between its watermarks; raise spool_bytes to at "
                           f"least {kept + 2 * biggest}")
        log(f"extract: producing into spool {self.root}: cap {self.cap} bytes (low watermark {self.low}), "
            f"format {self.fmt}; consumer {claim.get('consumer')}")
        try:
            while True:
                need = self._next_plan()
                if need is None:
                    break
                self._extract(need)
        finally:
            if self.target is not None:
                self.target.close()
        self.beat("done", force=True)
        log(f"extract: the consumer is done; {self.tokens} tokens produced in "
            f"{time.monotonic() - self.t0:.1f} s, {self.blocked_s:.1f} s blocked at the watermark")
        return EXIT_OK

    def _claim(self) -> dict:
        """The consumer's claim, waited for, and checked against this run (one line naming both)."""
        said = False
        while True:
            try:
                if (self.root / sp.SPOOL_FILE).exists():
                    return sp.check_producer(self.root, self.run.layer_ids, str(self.run.info.path.resolve()),
                                             str(Path(self.run.args.input).resolve()), sum(self.run.lengths))
            except sp.SpoolError as exc:
                raise BadInput(str(exc)) from None
            if not said:
                log(f"extract: waiting for the consumer (a train run with mode streamed and spool = {self.root})")
                said = True
            self.beat("waiting for the consumer")
            time.sleep(POLL_S)

    def _read_need(self) -> dict | None:
        try:
            return sp.read_record(self.root, sp.NEED_FILE)
        except sp.SpoolError:
            return None         # being replaced: read again

    def _next_plan(self) -> dict | None:
        """The consumer's next plan (a new seq), or None once it is done."""
        said = False
        while True:
            need = self._read_need()
            if need is not None and need.get("done"):
                return None
            if need is not None and need.get("seq") != self.seq:
                self.seq = need.get("seq")
                return need
            if not said and self.seq is not None:
                log(f"extract: plan {self.seq} produced; waiting for the consumer's next")
                said = True
            self.beat("waiting for the consumer's plan")
            time.sleep(POLL_S)

    def _extract(self, need: dict) -> None:
        """The plan's groups (the consumer's batches, in its order) that are not on disk yet."""
        where = f"{self.root / sp.NEED_FILE}"
        groups = need.get("groups")
        if not isinstance(groups, list):
            raise sp.SpoolError(f"{where}: groups: expected a list of sample-id lists")
        total = len(self.run.lengths)
        on_disk = sp.spool_files(self.root)
        seen: set[int] = set()
        todo: list[list[int]] = []
        first = sp.as_int_list(need.get("first") or [], f"{where}: first")
        # The batches the consumer has read already (this producer restarted mid-plan) are behind it.
        read = sp.groups_read(self.root, need.get("seq"))
        for k, group in [(-1, first)] + list(enumerate(groups))[read:]:
            ids = sp.as_int_list(group, f"{where}: groups[{k}]")
            bad = [i for i in ids if not 0 <= i < total]
            if bad:
                raise sp.SpoolError(f"{where}: groups[{k}]: sample ids {bad[:5]} outside 0..{total - 1}")
            left = [i for i in ids if i not in on_disk and i not in seen]
            seen.update(left)
            if left:
                todo.append(left)
        # Files of an earlier plan that this one does not read (a consumer that resumed from its
        # checkpoint, the writes that were in flight when the plan changed): never read, they would
        # hold the spool above its low watermark for good.
        keep = set(sp.as_int_list(need.get("keep") or [], f"{where}: keep"))
        wanted = keep | {i for group in todo for i in group} | {i for group in groups[read:] for i in group}
        stray = [path for idx, path in sp.spool_files(self.root).items() if idx not in wanted]
        for path in stray:
            path.unlink(missing_ok=True)
        if stray:
            log(f"extract: plan {need.get('seq')}: {len(stray)} sample file(s) of an earlier plan removed")
        if not todo:
            return
        band = self.cap - self.low
        heavy = max(todo, key=lambda g: sum(self.est[i] for i in g))
        if sum(self.est[i] for i in heavy) > band:
            raise sp.SpoolError(f"spool_bytes {self.cap}: a batch of the consumer ({len(heavy)} samples, up to "
                                f"{sum(self.est[i] for i in heavy)} bytes) does not fit between the watermarks "
                                f"({band} bytes); raise spool_bytes or lower the consumer's token_budget")
        if self.target is None:
            placement = self.placement_fn()
            self.target = self.engine.load(self.run.info, self.run.dtype, self.run.layer_ids, placement)
        log(f"extract: plan {need.get('seq')} (epoch {need.get('epoch')}, from position {need.get('position')}): "
            f"{sum(map(len, todo))} samples in {len(todo)} of the consumer's batches, in its order")
        batches, self.heads = [], {}
        for group in todo:
            parts = self._split(group)
            self.heads[tuple(parts[0])] = group
            batches += parts
        loop = Loop(self.target, self.run.samples, self.run.lengths, self.root, set(), self.run.args, 0, 1,
                    gate=self._gate, on_written=self._written, close_target=False)
        stats = loop.run([i for g in todo for i in g], batches=batches)
        if stats.get("disk_full") is not None:
            raise stats["disk_full"]

    def _split(self, group: list[int]) -> list[list[int]]:
        """One of the consumer's batches as forward batches within extract's token budget (padded to the longest)."""
        budget = self.run.args.token_budget
        out, cur, longest = [], [], 0
        for idx in group:
            n = self.run.lengths[idx]
            if cur and max(longest, n) * (len(cur) + 1) > budget:
                out.append(cur)
                cur, longest = [], 0
            cur.append(idx)
            longest = max(longest, n)
        out.append(cur)
        return out

    def _written(self, idx: int) -> None:
        with self.lock:
            self.pending.pop(idx, None)
            self.tokens += self.run.lengths[idx]

    def _held(self) -> int:
        """Bytes on the spool's disk and in the writers' hands."""
        with self.lock:
            pending = sum(self.pending.values())
        return sp.spool_bytes(self.root) + pending

    def _replanned(self) -> bool:
        """The consumer wrote another plan (a resume, the next epoch) or is done."""
        plan = self._read_need()
        return plan is not None and (plan.get("seq") != self.seq or bool(plan.get("done")))

    def _gate(self, batch: list[int]) -> bool:
        """Before the first forward batch of each of the consumer's batches: wait
        while that batch would take the spool past the cap (then until the
        consumer read it down to the low watermark); False when the consumer's
        plan changed meanwhile (a resume, the next epoch). Never inside one of
        its batches: the consumer reads whole batches, so a half-made one would
        hold the spool while the consumer waits for the rest."""
        group = self.heads.get(tuple(batch))
        if group is not None:
            need = sum(self.est[i] for i in group)
            held = self._held()
            if held + need > self.cap:
                t0 = time.monotonic()
                log(f"extract: blocked at the high watermark: spool {sp.fill_words(held, self.cap)}; "
                    f"waiting for the consumer to read it down to {self.low} bytes")
                while held > self.low or held + need > self.cap:
                    if self._replanned():
                        self.blocked_s += time.monotonic() - t0
                        return False
                    self.beat("blocked", blocked_now_s=round(time.monotonic() - t0, 3))
                    time.sleep(POLL_S)
                    held = self._held()
                self.blocked_s += time.monotonic() - t0
            if self._replanned():
                return False
        with self.lock:
            for i in batch:
                self.pending[i] = self.est[i]
        self.beat("producing")
        return True


def produce(run, engine, placement_fn) -> int:
    if run.world > 1:
        raise BadInput("spool_bytes: a spool has one producer process (the HF engine's world of one, or SGLang's "
                       "leader); run it without torchrun")
    producer = Producer(run, engine, placement_fn)
    try:
        return producer.produce()
    except BaseException as exc:
        # Said where the consumer looks (its waiting line names the producer's state).
        why = f"{type(exc).__name__}: {exc}".strip().rstrip(":")[:300]
        try:
            producer.beat(f"failed ({why})", force=True)
        except OSError:
            pass
        if isinstance(exc, sp.SpoolError):
            raise BadInput(str(exc)) from None
        raise

