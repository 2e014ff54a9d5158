"""Spec of the train stage: the EAGLE-3 drafter fitted on extracted hidden states.

Output: <output>/checkpoints/step_<N>/ (model.safetensors, trainer.pt,
meta.json), metrics.jsonl, train_config.json. Progress comes from the log's
`progress: step S/TOTAL loss L acc [..] tok/s X lr Y` lines (and tqdm).
Disk estimate: kept checkpoints x params x 12 bytes (fp32 weights + AdamW's
two fp32 moments).
"""

from __future__ import annotations

from pathlib import Path

from ops.drafter.metrics import from_record
from ops.drafter.sizes import drafter_params
from ops.spec import REQUIRED, CurveSource, EstimateContext, Gauge, OpSpec

CHECKPOINT_BYTES_PER_PARAM = 12


def estimate_bytes(ctx: EstimateContext) -> int | None:
    params = drafter_params(ctx)
    if params is None:
        return None
    keep = int(ctx.params.get("keep", 3) or 0) or 1
    return params * CHECKPOINT_BYTES_PER_PARAM * keep


def partial_files(root: Path) -> list[Path]:
    """Checkpoint directories left half-written (step_<N>.tmp-<pid>)."""
    ckpts = Path(root) / "checkpoints"
    if not ckpts.is_dir():
        return []
    return sorted(p for p in ckpts.iterdir() if ".tmp-" in p.name)


def result_line(metrics: dict) -> str | None:
    """The last line of metrics.jsonl: where the loss and the per-step
    accuracy stand (step 1 is what the first draft token's acceptance follows),
    and the acceptance length those accuracies simulate (bench's scale)."""
    if "step" not in metrics:
        return None
    acc = metrics.get("acc") or []
    sim = from_record(metrics)
    # The step says when the loss was measured; how far training is comes from
    # the log's `progress: step S/T` alone (one source for that figure).
    return (f"loss {metrics.get('loss', float('nan')):.4f} at step {metrics['step']}"
            + (f", accuracy per step {'/'.join(f'{a:.2f}' for a in acc)}" if acc else "")
            + (f", simulated AL {sim:.2f}" if sim is not None else ""))

def gauges(r: dict) -> list[Gauge]:
    """metrics.jsonl's last record for the exporter."""
    if "step" not in r:
        return []
    out = [Gauge("eagle3_train_step", "Optimizer steps done (metrics.jsonl's last record).", r.get("step")),
           Gauge("eagle3_train_planned_steps", "Optimizer steps the run plans.", r.get("total")),
           Gauge("eagle3_train_loss", "Training loss of the last logged window.", r.get("loss")),
           Gauge("eagle3_train_simulated_acceptance_length", "1 + sum_k prod_{j<=k} acc_j of the last window's "
                 "per-step accuracies: tokens per verify it promises (bench's scale).", from_record(r)),
           Gauge("eagle3_train_learning_rate", "Learning rate.", r.get("lr")),
           Gauge("eagle3_train_grad_norm", "Gradient norm before clipping.", r.get("grad_norm")),
           Gauge("eagle3_train_tokens_per_second", "Training tokens per second over the last window.",
                 r.get("tok_s"))]
    for name, key, doc in (("eagle3_train_step_accuracy_ratio", "acc", "Accuracy of TTT step k, 0..1."),
                           ("eagle3_train_step_loss", "step_loss", "Loss of TTT step k.")):
        values = r.get(key)
        if isinstance(values, list):
            out += [Gauge(name, doc, v, (("ttt_step", str(k)),)) for k, v in enumerate(values, 1)]
    return out


SPEC = OpSpec(
    name="train",
    summary="fit the EAGLE-3 drafter (fc + one decoder layer, training-time test over K steps)",
    params={
        "data": REQUIRED,           # extract's output directory
        "vocab": REQUIRED,          # vocab's output directory
        "output": REQUIRED,
        "epochs": 1,
        "max_steps": 0,
        "stop_at": 0,
        "lr": 1e-4,
        "min_lr_ratio": 0.0,
        "warmup_ratio": 0.02,
        "weight_decay": 0.0,
        "grad_clip": 0.5,
        "token_budget": 16384,      # padded tokens per micro-batch per rank; halved on OOM
        "max_len": 4096,
        "grad_accum": 1,
        "ttt_steps": 7,
        "decay": 0.8,
        "save_every": 500,
        "keep": 3,
        "log_every": 10,
        "seed": 0,
        "workers": 2,
        "holdout": 0,
        "resume": False,
        "replace_checkpoints": False,   # delete another run's checkpoints in the output (ops/train/owner.py)
        "report_to": "none",        # or "tensorboard": scalars under <output>/tb/ (the tensorboard extra)
        "device": "auto",
        "num_heads": None,
        "num_kv_heads": None,
        "intermediate_size": None,
        # Speed levers (ops/drafter/model.py); "auto" = the fast path on CUDA, the
        # old one on the CPU (ops/train/levers.py says why).
        "ttt_attention": "auto",    # or "mask" / "flex"
        "loss": "auto",             # or "full" / "chunked"
        "fused_adamw": "auto",      # or "on" / "off"
        "compile": "auto",          # or "on" / "off": torch.compile of each TTT step's work
        "length_bucket": "auto",    # or tokens (0 = off): 256 where flex or compile is on
    },
    output_params=("output",),
    uses_target=True,
    uses_gpu=True,
    batch_param="token_budget",
    progress="log",
    estimate_bytes=estimate_bytes,
    partial_files=partial_files,
    result_file="metrics.jsonl",
    result_line=result_line,
    estimate_rule="drafter parameters x bytes per parameter x checkpoints kept",
    gauges=gauges,
    curves=CurveSource("metrics.jsonl"),
)
