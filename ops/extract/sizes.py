"""extract's sizes from its params and prepare's summary: aux layers, tokens,
samples and the bytes they make (the spec's estimate_bytes, expected_*; the
estimate hook in estimate.py and the op's own disk preflight use them). No torch.

Disk estimate = tokens x (aux layers + 1) x hidden_size x the format's bytes
an element (bf16: the dtype's, 17,285,548 x 4 x 7168 x 2 = 923 GiB, seen 924 GB
by du -sh; fp8: 1 + 4 / hidden_size, 462 GiB; int4: 0.5, 231 GiB).
"""

from __future__ import annotations

import json
import sys
from array import array
from pathlib import Path

from ops import hidden_formats
from ops.common import count
from ops.spec import EstimateContext, dtype_bytes


# The max_seq_len param's default (its Param in spec.py), and the length the
# estimate's upper bound assumes where no params were merged with the defaults.
MAX_SEQ_LEN = 4096


def aux_layer_count(params: dict) -> int:
    ids = params.get("layer_ids", "auto")
    if isinstance(ids, (list, tuple)):
        return len(ids)
    if isinstance(ids, str) and ids not in ("", "auto"):
        return len([p for p in ids.split(",") if p.strip()])
    return 3


def _param_or_summary(ctx: EstimateContext, param: str, key: str) -> int | None:
    """The stage's own count (a param), else prepare's summary.json's; None when
    neither is a non-negative number (a summary cut short by a crash, a string)."""
    n = count(ctx.params.get(param))
    if n:
        return n
    summary = ctx.read_json("input", "summary.json")
    return count(summary.get(key)) if isinstance(summary, dict) else None


def _spool(ctx: EstimateContext) -> bool:
    """A spool's producer (spool_bytes): its files come and go as the consumer reads them, so
    no count of them is progress (the log's `progress:` lines are, per plan)."""
    return bool(ctx.params.get("spool_bytes"))


def expected_tokens(ctx: EstimateContext) -> int | None:
    return None if _spool(ctx) else tokens_and_source(ctx)[0]


def tokens_and_source(ctx: EstimateContext) -> tuple[int | None, str]:
    """The tokens this run extracts and where that figure comes from: the tokens
    param, else prepare's summary.json, else (num_samples below prepare's
    samples, or a max_seq_len below prepare's) the lengths in prepare's
    samples.safetensors: the first num_samples, each cut at max_seq_len (60
    samples of 398 were 22,019 tokens, 6.6x the 3,097 extracted). None when
    the cut cannot be counted (the figure is then no exact one)."""
    n = count(ctx.params.get("tokens"))
    if n:
        return n, "the tokens param"
    summary = ctx.read_json("input", "summary.json")
    if not isinstance(summary, dict):
        return None, ""
    total = count(summary.get("total_tokens"))
    if total is None:
        return None, ""
    where = f"prepare's summary.json in {ctx.path('input')}"
    limit = count(ctx.params.get("num_samples")) or None
    max_len = count(ctx.params.get("max_seq_len")) or None
    samples, prep_len = count(summary.get("samples")), count(summary.get("max_seq_len"))
    cut_samples = limit is not None and (samples is None or limit < samples)
    cut_len = max_len is not None and prep_len is not None and max_len < prep_len
    may_cut = max_len is not None and prep_len is None      # a summary that does not say its cut
    if not (cut_samples or cut_len or may_cut):
        return total, where
    lengths = prepared_lengths(ctx.path("input"))
    if lengths is None:
        return (None, "") if cut_samples or cut_len else (total, where)
    if may_cut and not cut_samples and max(lengths, default=0) <= max_len:
        return total, where
    cut_len = cut_len or may_cut
    if limit is not None:
        lengths = lengths[:limit]
    cap = max_len if max_len is not None else max(lengths, default=0)
    cut = sum(min(x, cap) for x in lengths)
    said = ((f"the first {len(lengths):,} samples" if cut_samples else f"{len(lengths):,} samples")
            + (f" cut at max_seq_len {max_len:,}" if cut_len else ""))
    return cut, f"{said} of prepare's samples.safetensors in {ctx.path('input')}"


_LENGTHS: dict[str, tuple[tuple[int, int], list[int] | None]] = {}


def prepared_lengths(directory: Path | None) -> list[int] | None:
    """Each sample's length from the `offsets` of prepare's samples.safetensors:
    its header and that one array are read (no numpy), again only when the file
    changed. None when it cannot be read."""
    if directory is None:
        return None
    path = Path(directory) / "samples.safetensors"
    try:
        st = path.stat()
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size)
    cached = _LENGTHS.get(str(path))
    if cached is not None and cached[0] == key:
        return cached[1]
    lengths: list[int] | None = None
    try:
        with open(path, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            if 0 < size <= 100_000_000:
                entry = json.loads(fh.read(size)).get("offsets") or {}
                a, b = (int(x) for x in entry["data_offsets"])
                if entry.get("dtype") == "I64" and 0 <= a <= b and (b - a) % 8 == 0:
                    fh.seek(8 + size + a)
                    offsets = array("q")
                    offsets.frombytes(fh.read(b - a))
                    if sys.byteorder != "little":
                        offsets.byteswap()
                    lengths = [int(offsets[i + 1] - offsets[i]) for i in range(len(offsets) - 1)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        lengths = None
    _LENGTHS[str(path)] = (key, lengths)
    return lengths


def expected_samples(ctx: EstimateContext) -> int | None:
    return None if _spool(ctx) else _param_or_summary(ctx, "num_samples", "samples")


def state_dtype(params: dict, target: dict) -> str:
    """The dtype the states are written in: the stage's, else the target's ("auto")."""
    dtype = params.get("dtype")
    return str(dtype if dtype not in (None, "auto") else target.get("dtype") or "bfloat16")


def state_format(params: dict) -> str:
    """The storage format of the states (the format param; an unknown one is the config check's to refuse)."""
    fmt = params.get("format") or hidden_formats.DEFAULT
    return fmt if fmt in hidden_formats.FORMATS else hidden_formats.DEFAULT


def states_bytes(params: dict, target: dict, tokens: int, states: int, hidden: int) -> int:
    """Bytes of `tokens` rows of `states` states in the stage's format and dtype."""
    return hidden_formats.state_bytes(state_format(params), tokens, states, hidden,
                                      dtype_bytes(state_dtype(params, target)))


def estimate_bytes(ctx: EstimateContext) -> int | None:
    tokens = expected_tokens(ctx)
    hidden = ctx.target.get("hidden_size")
    if tokens is None or not hidden:
        return None
    return states_bytes(ctx.params, ctx.target, tokens, aux_layer_count(ctx.params) + 1, int(hidden))
