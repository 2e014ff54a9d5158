"""Where train reports its metrics besides metrics.jsonl: `--report-to
tensorboard` writes each logged window as TensorBoard scalars under
<output>/tb/ (tensorboardX, the `tensorboard` extra; torch.utils.tensorboard
when only the `tensorboard` package is there). `none` (the default) imports
nothing and writes nothing.

Tags: train/loss, train/step_loss/<k>, train/acc/<k>,
train/simulated_acceptance_length, train/lr, train/grad_norm, train/tok_s;
the global step is the optimizer step.
"""

from __future__ import annotations

from pathlib import Path

CHOICES = ("none", "tensorboard")
TB_DIR = "tb"


class ReportError(Exception):
    pass


def _summary_writer():
    try:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    except ImportError:
        pass
    try:
        from torch.utils.tensorboard import SummaryWriter
        return SummaryWriter
    except ImportError:
        raise ReportError("report_to = tensorboard needs tensorboardX: "
                          "pip install 'eagle3-console[tensorboard]'") from None


class TensorBoardReport:
    def __init__(self, writer_class, output: Path):
        self.dir = Path(output) / TB_DIR
        self._writer_class = writer_class
        self.writer = None          # opened at the first window: a run that fails to start leaves no tb/

    def log(self, rec: dict) -> None:
        if self.writer is None:
            # Both writers take the folder as their first argument (logdir / log_dir).
            self.writer = self._writer_class(str(self.dir))
        step = int(rec["step"])
        add = self.writer.add_scalar
        for key in ("loss", "simulated_acceptance_length", "lr", "grad_norm", "tok_s"):
            if rec.get(key) is not None:
                add(f"train/{key}", float(rec[key]), step)
        for key in ("step_loss", "acc"):
            for k, v in enumerate(rec.get(key) or [], 1):
                add(f"train/{key}/{k}", float(v), step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def open_report(kind: str, output: Path, write: bool = True) -> TensorBoardReport | None:
    """The reporter for --report-to, or None for `none` (and on ranks that do
    not write). Every rank checks the writer is installed, so that all of them
    stop with the same ReportError before any training, none waiting for the rest."""
    if kind == "none":
        return None
    if kind != "tensorboard":
        raise ReportError(f"--report-to {kind!r}: one of {', '.join(CHOICES)}")
    writer_class = _summary_writer()
    return TensorBoardReport(writer_class, output) if write else None
