"""The training-speed levers' "auto" values, resolved for the device.

One function for ops.train and benchmarks/train_throughput.py, so the benchmark
times what the program runs. No torch import: the caller says whether it runs
on CUDA.

Why flex + chunked loss + fused AdamW + compile are the CUDA default:
- each equals the plain path within bf16 noise on the same batch
  (`benchmarks/train_throughput.py --check-levers` on CUDA,
  tests/test_drafter_levers.py on the CPU), and together they raise the MFU
  (benchmarks/RESULTS.md has the measured figures);
- what kept them opt-in was one FlexAttention compile per padded batch length
  (every distinct length of a real corpus); length buckets bound that to one
  shape a bucket (ops/drafter/data.py), so the compiles are paid once, in
  the first batches, for at most max_len / bucket shapes (16 at 4,096 / 256).
On the CPU the old path stays: FlexAttention has no CPU backward, inductor on
the CPU compiles slowly for no measured gain, and the CPU tests' loss curves
are the old path's.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_BUCKET = 256     # tokens: at most 16 buckets up to 4,096, padding < 256 / length
# Each lever's values (the train spec's params declare them as its choices).
TTT_ATTENTION = ("auto", "mask", "flex")
LOSS = ("auto", "full", "chunked")
SWITCH = ("auto", "on", "off")


class LeverError(ValueError):
    pass


@dataclass(frozen=True)
class Levers:
    ttt_attention: str      # "mask" | "flex"
    loss: str               # "full" | "chunked"
    fused_adamw: bool
    compile: bool
    length_bucket: int      # 0: pad to the batch's longest sample

    def describe(self) -> str:
        return (f"ttt attention {self.ttt_attention}, loss {self.loss}, fused AdamW "
                f"{'on' if self.fused_adamw else 'off'}, compile {'on' if self.compile else 'off'}, "
                f"length bucket {self.length_bucket or 'off'}")


def _choice(name: str, value, allowed: tuple[str, ...]) -> str:
    value = str(value)
    if value not in allowed:
        raise LeverError(f"--{name.replace('_', '-')} {value!r}: expected one of {', '.join(allowed)}")
    return value


def parse_bucket(value) -> str:
    """--length-bucket: 'auto' or a whole number of tokens (0 = off), as text;
    LeverError (a ValueError) otherwise, which the param's check and argparse
    both report (ops/params.py)."""
    text = str(value)
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise LeverError("expected 'auto' or a whole number of tokens (0 = off)")
    return str(n)


def resolve(cuda: bool, ttt_attention="auto", loss="auto", fused_adamw="auto", compile="auto",
            length_bucket="auto") -> Levers:
    attn = _choice("ttt_attention", ttt_attention, TTT_ATTENTION)
    loss_v = _choice("loss", loss, LOSS)
    fused = _choice("fused_adamw", fused_adamw, SWITCH)
    comp = _choice("compile", compile, SWITCH)
    attn = ("flex" if cuda else "mask") if attn == "auto" else attn
    loss_v = ("chunked" if cuda else "full") if loss_v == "auto" else loss_v
    fused_b = cuda if fused == "auto" else fused == "on"
    comp_b = cuda if comp == "auto" else comp == "on"
    bucket = str(length_bucket)
    if bucket == "auto":
        # Buckets only pay where a kernel is built per shape.
        n = DEFAULT_BUCKET if (attn == "flex" or comp_b) else 0
    else:
        n = int(parse_bucket(bucket))
    return Levers(ttt_attention=attn, loss=loss_v, fused_adamw=fused_b, compile=comp_b, length_bucket=n)
