"""The forward loop of extract: this rank's token-budget batches through the
target, each sample's states into its file image, the images to the writers.

Sits under run.py (which sets the run up: config, resume, the engine's
target, and the closing data_config) and over batching.py (the plan, the OOM
halving), the engine's Target (engine.py: ops/target_model/forward.py's hooked forward or
sglang_run.py's packed one; the loop does not know which), staging.py +
sample_file.py (pinned file images) and writer.py (the writer threads).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from ops.common import EXIT_FAILURE
from ops.extract import batching, durable
from ops.extract.progress import Progress
from ops.extract.sample_file import SampleImage
from ops.extract.staging import SlabPool
from ops.extract.writer import SampleWriter, WriteJob
from ops.formats import sample_path
from ops.hidden_codec import encode_states, state_specs
from ops.hidden_formats import BF16, file_metadata


def log(message: str) -> None:
    print(message, file=sys.stdout, flush=True)


class Loop:
    """Plans this rank's batches, runs them through `target` (engine.py's
    Target), hands each sample to the writers."""

    def __init__(self, target, samples, lengths, out_dir, done, args, rank, world, *, gate=None,
                 on_written=None, close_target: bool = True) -> None:
        self.target = target
        # The spool's producer (ops/extract/spool_producer.py): `gate(batch)` before each batch
        # (blocks at the watermark; False: stop, the consumer's plan changed), `on_written(idx)`
        # once a file has its name; the target outlives one plan's loop.
        self.gate, self.on_written, self.close_target = gate, on_written, close_target
        self.samples, self.lengths, self.out_dir, self.done = samples, lengths, out_dir, done
        self.args, self.rank, self.world = args, rank, world
        self.fmt = getattr(args, "format", BF16)
        self.metadata = file_metadata(self.fmt)
        self._copy_streams: dict = {}
        self._pool: SlabPool | None = None
        # The loop's own time: in the target's forward, and blocked on the
        # writers (their queue full; a full host pool is staging.py's
        # waited_s). With the writers' own split (writer.py) this says what
        # bounds a run: the closing `extract: time:` line.
        self.forward_s = 0.0
        self.queue_wait_s = 0.0

    def run(self, mine: list[int], batches: list[list[int]] | None = None) -> dict:
        """Extract `mine` in token-budget batches (`batches`: a plan given in the
        consumer's order instead of batching.py's, longest first)."""
        done_mine = [i for i in mine if i in self.done]
        writer_box: list = []
        progress = Progress(total=len(mine), done=len(done_mine),
                                  tokens=sum(self.lengths[i] for i in done_mine),
                                  interval=self.args.progress_interval, rank=self.rank, world=self.world,
                                  bar=self.rank == 0,
                                  errors=lambda: writer_box[0].errors.count if writer_box else 0)
        writer = SampleWriter(self.args.writers, self.args.queue_size,
                                    on_written=lambda idx, n: self._written(progress, idx, n),
                                    fsync=self.args.durable in ("fsync", "direct"),
                                    direct=self.args.durable == "direct")
        writer_box.append(writer)
        self.writer = writer
        if batches is None:
            batches = batching.plan_batches(mine, self.lengths.__getitem__, self.args.token_budget)
        self.batches = batches
        oom_types = (torch.cuda.OutOfMemoryError,)
        try:
            for batch in batches:
                if all(i in self.done for i in batch):
                    continue
                if self.gate is not None and not self.gate(batch):
                    break
                batching.run_with_oom_retry(batch, self.lengths.__getitem__, self.args.token_budget,
                                            self._forward, oom_types, log, self._free_cache)
                if writer.errors.disk_full is not None:
                    break       # every later write would fail the same way
        except batching.SampleTooLarge as exc:
            writer.close()
            progress.close()
            if self.close_target:
                self.target.close()
            print(str(exc), file=sys.stderr, flush=True)
            raise SystemExit(EXIT_FAILURE) from None
        writer.close()
        log(time_line(progress.elapsed(), self.forward_s,
                      self.queue_wait_s + (self._pool.waited_s if self._pool else 0.0), writer,
                      f" rank {self.rank}/{self.world}" if self.world > 1 else ""))
        # Before progress.close(), so the closing tok/s pays for durability;
        # before the caller's all_reduce, so every rank's files are down
        # before rank 0 writes "complete".
        log(durable.finish(self.out_dir, self.args.durable))
        progress.close()
        if self.close_target:
            self.target.close()
        if writer.errors.disk_full is None:     # else one line says it (extract())
            for message in writer.errors.messages:
                print(f"extract: write error: {message}", file=sys.stderr, flush=True)
        return {"new_samples": progress.new_samples, "new_tokens": progress.new_tokens,
                "errors": writer.errors.count, "elapsed": progress.elapsed(),
                "disk_full": writer.errors.disk_full}

    def _written(self, progress, idx: int, tokens: int) -> None:
        progress.add(1, tokens)
        if self.on_written is not None:
            self.on_written(idx)

    def _free_cache(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _forward(self, batch: list[int]) -> None:
        rows = [(idx, *self.samples.get(idx)) for idx in batch]
        t0 = time.perf_counter()
        out = self.target.forward([tok for _idx, tok, _loss in rows])
        self.forward_s += time.perf_counter() - t0
        # Samples already on disk ran only to keep the batch's planned shapes.
        self._submit(out.aux, out.final, [(idx, tok, loss, *state) for (idx, tok, loss), state
                                          in zip(rows, out.samples) if idx not in self.done])

    def _submit(self, aux, final, pieces) -> None:
        """Each sample's (idx, ids, loss mask, aux states, final states) into
        its file image, then to the writers. The states are encoded in the
        run's format where they are (on the GPU: only the format's bytes are
        copied to the host), then copied on a side stream (_to_host)."""
        hidden = final.shape[-1]
        pieces = [(idx, tok, loss, encode_states(self.fmt, {"aux_hidden_states": a, "final_hidden_states": f},
                                                 hidden)) for idx, tok, loss, a, f in pieces]
        images = self._slabs(aux, final).take([self._specs(aux, final, len(tok)) for _i, tok, *_ in pieces],
                                              self.metadata)
        for image, (_idx, tok, loss, _states) in zip(images, pieces):
            image.views["input_ids"].copy_(torch.from_numpy(tok.astype(np.int64)))
            image.views["loss_mask"].copy_(torch.from_numpy(loss.astype(np.uint8)))
        ready = self._to_host(aux, final, pieces, images) if aux.is_cuda else _copy_states(images, pieces)
        t0 = time.perf_counter()
        for image, (idx, tok, *_rest) in zip(images, pieces):
            self.writer.submit(WriteJob(idx, sample_path(self.out_dir, idx), image, ready, len(tok)))
        self.queue_wait_s += time.perf_counter() - t0

    def _slabs(self, aux, final) -> SlabPool:
        """The pool, sized at the first batch (when the states' dtype and width
        are known) to the largest planned batch, so every batch fits a slab."""
        if self._pool is None:
            largest = max(sum(SampleImage.padded_size(self._specs(aux, final, self.lengths[i]), self.metadata)
                              for i in batch) for batch in self.batches)
            self._pool = SlabPool(self.args.host_batches, largest, pin=aux.is_cuda)
        return self._pool

    def _specs(self, aux, final, n: int) -> dict:
        hidden = final.shape[-1]
        return {"input_ids": (torch.int64, (n,)), "loss_mask": (torch.uint8, (n,)),
                **state_specs(self.fmt, "aux_hidden_states", n, aux.shape[-1], hidden, aux.dtype),
                **state_specs(self.fmt, "final_hidden_states", n, hidden, hidden, final.dtype)}

    def _to_host(self, aux, final, pieces, images) -> object:
        """Copy each sample's states from the device into its pinned file image
        on a side stream; the event the writers wait on.

        Pinned, so the copy is a real asynchronous DMA (into pageable memory
        cudaMemcpyAsync blocks the host until it is done) and runs on the
        copy engine beside the next forward; into the image, so the bytes
        the GPU wrote are the bytes the disk gets. A writer writes an image
        only after the copy's event, and a slab (staging.py) is reused only
        after all of its images were written. The device allocator waits for
        the copy through record_stream.
        """
        stream = self._copy_streams.get(aux.device)
        if stream is None:
            stream = self._copy_streams[aux.device] = torch.cuda.Stream(device=aux.device)
        stream.wait_stream(torch.cuda.current_stream(aux.device))
        with torch.cuda.stream(stream):
            _copy_states(images, pieces, non_blocking=True)
        aux.record_stream(stream)
        final.record_stream(stream)
        if self.fmt != BF16:    # the encoded parts are the batch's own tensors, not views of aux/final
            for *_head, states in pieces:
                for part in states.values():
                    part.record_stream(stream)
        ready = torch.cuda.Event()
        ready.record(stream)
        return ready


def time_line(elapsed: float, forward_s: float, writers_wait_s: float, writer: SampleWriter,
              rank: str = "") -> str:
    """Where the run's time went. The loop waiting for the writers while they
    write: the disk bounds the run. The loop in the forward with no one
    waiting for it: the target does (GPU or host; NVML's busy share tells
    which: a forward that syncs, as the MoE ones on the H200 do, holds the
    loop while the GPU works). The writers' figures are summed over their
    threads, idle included, so they add up to threads x elapsed."""
    busy = writer.copy_wait_s + writer.write_s
    idle = max(0.0, writer.threads * elapsed - busy)
    return (f"extract: time: {elapsed:.1f} s; loop: forward {forward_s:.1f} s, waiting for the writers "
            f"{writers_wait_s:.1f} s; writers ({writer.threads}, summed): waiting for the device copy "
            f"{writer.copy_wait_s:.1f} s, writing {writer.write_s:.1f} s, idle {idle:.1f} s{rank}")


def _copy_states(images, pieces, non_blocking: bool = False) -> None:
    """Each piece's encoded states into its image (None: nothing to wait on)."""
    for image, (_idx, _tok, _loss, states) in zip(images, pieces):
        for name, part in states.items():
            image.views[name].copy_(part, non_blocking=non_blocking)
