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
from ops.spec import CurvePoint, CurveSource, EstimateContext, Gauge, Lint, OpSpec, Param
from ops.target_params import DTYPE, LAYER_IDS, named
from ops.train.online import bound_words
from ops.train.levers import LOSS, SWITCH, TTT_ATTENTION, parse_bucket

CHECKPOINT_BYTES_PER_PARAM = 12
# offline: states read from extract's folder; online: computed by the target in this run.
# streamed: read from a spool an extract run fills (ops/spool.py), deleted once read.
MODES = ("offline", "online", "streamed")


def _tokens(ctx: EstimateContext) -> tuple[int | None, str]:
    """The tokens an epoch trains on: prepare's summary (online), else extract's data_config."""
    from ops.common import count

    summary = ctx.read_json("samples", "summary.json") if ctx.params.get("samples") else None
    if isinstance(summary, dict) and count(summary.get("total_tokens")):
        return count(summary.get("total_tokens")), "prepare's summary"
    config = ctx.read_json("data", "data_config.json") if ctx.params.get("data") else None
    if isinstance(config, dict) and count(config.get("total_tokens")):
        return count(config.get("total_tokens")), "extract's data_config"
    return None, ""


def step_point(rec: dict) -> CurvePoint | None:
    """A step record (metrics.jsonl's line: step, loss, acc) as a point of the curves."""
    step, loss = rec.get("step"), rec.get("loss")
    if not isinstance(step, int) or not isinstance(loss, (int, float)):
        return None
    acc = rec.get("acc") if isinstance(rec.get("acc"), list) else []
    return CurvePoint(step, float(loss), tuple(float(a) if isinstance(a, (int, float)) else float("nan")
                                               for a in acc), from_record(rec))


class Train(OpSpec):
    name = "train"
    summary = "fit the EAGLE-3 drafter (fc + one decoder layer, training-time test over K steps)"
    params = (
        Param("mode", "offline", "where the states come from: offline (extract's folder, `data`), online (the "
              "target, loaded by this run, computes each batch's states: nothing of size on disk)",
              choices=MODES),
        Param("data", None, "offline: extract's output directory (hidden states)", type=str),
        Param("samples", None, "online: prepare's output directory (samples.safetensors), read again each "
              "epoch", type=str),
        Param("spool", None, "streamed: the spool folder an extract run with spool_bytes produces into "
              "(claimed by this run; what it reads is deleted)", type=str),
        Param("keep_bytes", 0, "streamed: keep the first samples by id that fit this many bytes on the spool "
              "across epochs (extracted once; the rest is extracted again each epoch)", low=0),
        LAYER_IDS,
        named(DTYPE, "target_dtype", "online: the target's dtype: "),
        Param("target_compile", False, "online: torch.compile the target's decoder layers (extract's compile: "
              "fuses the eager forward's small kernels; the first batches pay the compile)"),
        Param("target_device", "auto", "online: where the target runs: auto (the drafter's device), cpu, cuda:N "
              "(a GPU of its own)"),
        Param("vocab", help="vocab's output directory (vocab.safetensors)"),
        Param("output", help="output directory (checkpoints/, metrics.jsonl)"),
        Param("epochs", 1, "passes over the training samples", low=1),
        Param("max_steps", 0, "stop after this many steps (0: epochs decide)", low=0),
        Param("stop_at", 0, "leave after this step with a checkpoint, the schedule still spanning the whole "
              "run (train in slices; --resume continues)", low=0),
        Param("lr", 1e-4, "peak learning rate"),
        Param("min_lr_ratio", 0.0, "the cosine schedule's floor, a share of lr"),
        Param("warmup_ratio", 0.02, "share of the steps spent warming up"),
        Param("weight_decay", 0.0, "AdamW's weight decay (matrices only)"),
        Param("grad_clip", 0.5, "gradient norm clip"),
        Param("token_budget", 16384, "padded tokens per micro-batch per rank; halved on OOM", low=1),
        Param("max_len", 4096, "tokens of a sample trained on", low=1),
        Param("grad_accum", 1, "micro-batches an optimizer step", low=1),
        Param("ttt_steps", 7, "K: draft steps of the training-time test", low=1),
        Param("decay", 0.8, "weight of step k's loss: decay**k"),
        Param("save_every", 500, "steps between checkpoints", low=1),
        Param("keep", 3, "checkpoints kept (0: all)", low=0),
        Param("log_every", 10, "steps between `progress:` lines and metrics.jsonl records", low=1),
        Param("seed", 0, "seed of the init, the shuffle and the holdout"),
        Param("workers", 2, "DataLoader worker processes", low=0),
        Param("holdout", 0, "samples kept out of training (for bench and the simulated acceptance length)", low=0),
        Param("resume", False, "continue from the newest checkpoint in --output"),
        Param("replace_checkpoints", False, "delete another run's checkpoints in --output and start over "
              "(ops/train/owner.py)"),
        Param("report_to", "none", "tensorboard: also write the metrics as TensorBoard scalars under "
              "<output>/tb/ (the tensorboard extra)", choices=("none", "tensorboard")),
        Param("device", "auto", "auto | cpu | cuda"),
        Param("num_heads", None, "override the target's num_attention_heads", type=int, low=1),
        Param("num_kv_heads", None, "override the target's num_key_value_heads", type=int, low=1),
        Param("intermediate_size", None, "override the target's intermediate_size", type=int, low=1),
        # Speed levers (ops/drafter/model.py; equal to the old path within bf16 noise,
        # timed by benchmarks/train_throughput.py). "auto": on CUDA the fast path,
        # on the CPU the old one (ops/train/levers.py says why).
        Param("ttt_attention", "auto", "TTT attention: explicit mask through SDPA, or a FlexAttention block "
              "mask (CUDA)", choices=TTT_ATTENTION),
        Param("loss", "auto", "soft CE over full fp32 logits, or chunked with the LM head (less memory)",
              choices=LOSS),
        # A bare --fused-adamw (the flag this was before it took a value; a pipeline
        # file's `fused_adamw = true` still writes it) means on.
        Param("fused_adamw", "auto", "AdamW's fused kernel", choices=SWITCH, const="on"),
        Param("compile", "auto", "torch.compile each TTT step's layer and loss work (one graph per batch "
              "shape)", choices=SWITCH),
        Param("length_bucket", "auto", "pad each batch's length up to a multiple of this many tokens (0: to "
              "its longest sample; auto: 256 where flex or compile builds a kernel per shape)",
              convert=parse_bucket),
    )
    output_params = ("output",)
    input_params = ("data", "samples", "vocab")
    uses_target = True
    batch_param = "token_budget"
    result_file = "metrics.jsonl"
    estimate_rule = "drafter parameters x bytes per parameter x checkpoints kept"
    curves = CurveSource("metrics.jsonl", step_point)

    def spreads(self, params: dict) -> str | None:
        return "torchrun"

    def estimate_bytes(self, ctx: EstimateContext) -> int | None:
        params = drafter_params(ctx)
        if params is None:
            return None
        keep = int(ctx.params.get("keep", self.params["keep"]) or 0) or 1
        return params * CHECKPOINT_BYTES_PER_PARAM * keep

    def lint(self, ctx: EstimateContext, gpus: list[int] | None) -> list[Lint]:
        """Where the states come from, said before a launch: each mode's own input set."""
        params = self.effective(ctx.params)
        where = f"stages.{ctx.stage or 'train'}.params"
        mode = params.get("mode")
        out: list[Lint] = []
        if mode == "offline" and not params.get("data"):
            out.append(Lint("error", f"{where}.data: mode offline reads extract's output (hidden states) and none "
                                     f"is named; set data, or mode = \"online\" with samples = prepare's output"))
        if mode == "streamed" and not params.get("spool"):
            out.append(Lint("error", f"{where}.spool: mode streamed reads a spool that an extract run with "
                                     f"spool_bytes fills, and none is named; set spool = that run's output"))
        if mode in ("online", "streamed"):
            if not params.get("samples"):
                out.append(Lint("error", f"{where}.samples: mode {mode} runs the target on prepare's samples and "
                                         f"none are named; set samples = prepare's output directory"))
            if params.get("data"):
                out.append(Lint("warning", f"{where}.data: not read in mode {mode} (the target computes the states)"))
        return out

    def plan_lines(self, ctx: EstimateContext) -> list[str]:
        """The disk each mode needs and what online costs instead: states stored
        once (offline, in each format) against one target forward a token an epoch."""
        from ops import hidden_formats
        from ops.spec import dtype_bytes
        from ops.units import human_bytes

        params = self.effective(ctx.params)
        hidden = ctx.target.get("hidden_size")
        tokens, source = _tokens(ctx)
        ckpt = self.estimate_bytes(ctx)
        ckpt_words = human_bytes(ckpt) if ckpt else "unknown"
        lines = [f"mode {params.get('mode')}: online needs checkpoints only ({ckpt_words}); offline also the "
                 f"extracted states"]
        if tokens and hidden:
            width = dtype_bytes(str(ctx.target.get("dtype") or "bfloat16"))
            by_format = " | ".join(
                f"{fmt} {human_bytes(hidden_formats.state_bytes(fmt, tokens, 4, int(hidden), width))}"
                for fmt in hidden_formats.FORMATS)
            epochs = int(params.get("epochs") or 1)
            lines.append(f"offline states for {tokens:,} tokens ({source}): {by_format}; online instead runs the "
                         f"target's forward once a token an epoch: {epochs} x {tokens:,} = {epochs * tokens:,} "
                         f"token forwards")
        return lines

    def partial_files(self, root: Path) -> list[Path]:
        """Checkpoint directories left half-written (step_<N>.tmp-<pid>)."""
        ckpts = Path(root) / "checkpoints"
        if not ckpts.is_dir():
            return []
        return sorted(p for p in ckpts.iterdir() if ".tmp-" in p.name)

    def result_line(self, metrics: dict) -> str | None:
        """The last line of metrics.jsonl: where the loss and the per-step
        accuracy stand (step 1 is what the first draft token's acceptance follows),
        and the simulated acceptance length (bench's scale; ops/drafter/metrics.py)."""
        if "step" not in metrics:
            return None
        acc = metrics.get("acc") or []
        sim = from_record(metrics)
        # The step says when the loss was measured; how far training is comes from
        # the log's `progress: step S/T` alone (one source for that figure).
        return (f"loss {metrics.get('loss', float('nan')):.4f} at step {metrics['step']}"
                + (f", accuracy per step {'/'.join(f'{a:.2f}' for a in acc)}" if acc else "")
                + (f", simulated AL {sim:.2f}" if sim is not None else "")
                # Said, since the accuracies before it are the training window's.
                + (" on held-out samples" if sim is not None and metrics.get("heldout") else "")
                + (f"; online, {bound_words(metrics['online'])}" if isinstance(metrics.get("online"), dict) else ""))

    def gauges(self, r: dict) -> list[Gauge]:
        """metrics.jsonl's last record for the exporter."""
        if "step" not in r:
            return []
        out = [Gauge("eagle3_train_step", "Optimizer steps done (metrics.jsonl's last record).", r.get("step")),
               Gauge("eagle3_train_planned_steps", "Optimizer steps the run plans.", r.get("total")),
               Gauge("eagle3_train_loss", "Training loss of the last logged window.", r.get("loss")),
               Gauge("eagle3_train_simulated_acceptance_length", "Bench's count (completion tokens / verify steps) "
                     "of a decode over the held-out answers at the last window; without held-out samples "
                     "1 + sum_k prod_{j<=k} acc_j of its per-step accuracies.", from_record(r)),
               Gauge("eagle3_train_learning_rate", "Learning rate.", r.get("lr")),
               Gauge("eagle3_train_grad_norm", "Gradient norm before clipping.", r.get("grad_norm")),
               Gauge("eagle3_train_tokens_per_second", "Training tokens per second over the last window.",
                     r.get("tok_s"))]
        online = r.get("online")
        if isinstance(online, dict):
            # Online mode: both sides of the pipeline and which one bounds it (ops/train/online.py).
            out += [Gauge("eagle3_train_target_tokens_per_second", "Online: tokens a second through the target's "
                          "forward over the last window (the producer).", online.get("target_tok_s")),
                    Gauge("eagle3_train_drafter_tokens_per_second", "Online: tokens a second through the drafter's "
                          "steps over the last window, waiting apart (the consumer).", online.get("drafter_tok_s")),
                    Gauge("eagle3_train_wait_ratio", "Online: share of the last window the drafter waited for the "
                          "target's states, 0..1.", online.get("wait_share")),
                    Gauge("eagle3_train_bound_by_target", "Online: 1 when the target's forward bounds the run (the "
                          "drafter waited a third of the window or more), 0 when the drafter's step does.",
                          1 if online.get("bound") == "target" else 0)]
        for name, key, doc in (("eagle3_train_step_accuracy_ratio", "acc", "Accuracy of TTT step k, 0..1."),
                               ("eagle3_train_step_loss", "step_loss", "Loss of TTT step k.")):
            values = r.get(key)
            if isinstance(values, list):
                out += [Gauge(name, doc, v, (("ttt_step", str(k)),)) for k, v in enumerate(values, 1)]
        return out


SPEC = Train()
# The record's line under a name of the module's own (the tests import it).
result_line = SPEC.result_line
