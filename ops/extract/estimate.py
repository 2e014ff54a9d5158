"""extract's disk estimate with how it was made (OpSpec.estimate; kinds in ops/estimate.py).

exact from a token count (the `tokens` param, prepare's summary.json), else
from the output tree's own metadata (a foreign tree), else an upper bound:
samples x max_seq_len, the samples and length taken from extract's params
and those of the prepare stage writing its input (EstimateContext.upstream).
plan.disk_estimate asks it with the stage's effective params. No torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ops.estimate import Estimate
from ops.common import count
from ops.extract.sizes import (MAX_SEQ_LEN, aux_layer_count, estimate_bytes, state_dtype, state_format, states_bytes,
                               tokens_and_source)
from ops.formats import SAMPLE_LENGTHS, read_data_config
from ops.spec import EstimateContext, dtype_bytes

PER_FILE = "plus per-file overhead (headers, input_ids, loss_mask)"


def extract_estimate(ctx: EstimateContext) -> Estimate | None:
    params, target = ctx.params, ctx.target
    dtype = state_dtype(params, target)
    db = dtype_bytes(dtype)
    aux = aux_layer_count(params)
    hidden = count(target.get("hidden_size"))

    fmt = state_format(params)

    def factors(states: int, hid: int, states_from: str = "", hidden_from: str = "") -> str:
        s = f"{states} states{states_from or f' ({states - 1} aux + final)'}"
        if fmt == "fp8":
            return f"{s} x ({hid:,}{hidden_from} x 1 B + a 4 B scale) (fp8)"
        if fmt == "int4":
            return f"{s} x {hid:,}{hidden_from} x 0.5 B (int4)"
        return f"{s} x {hid:,}{hidden_from} x {db} B ({dtype})"

    exact = estimate_bytes(ctx) if hidden else None
    if exact is not None:
        tokens, where = tokens_and_source(ctx)
        return Estimate(int(exact), "exact", f"{tokens or 0:,} tokens ({where}) x {factors(aux + 1, hidden)}, "
                                             f"{PER_FILE}")
    out = ctx.path("output")
    meta = tree_metadata(out) if out is not None else {}
    m_hidden = count(meta.get("hidden_size")) or hidden
    m_states = count(meta.get("num_layers_captured"))
    states_from = " (num_layers_captured)" if m_states else ""
    m_states = m_states or aux + 1
    if meta.get("tokens") is not None and m_hidden:
        hidden_from = " (its hidden_size)" if meta.get("hidden_size") else ""
        return Estimate(states_bytes(params, target, meta["tokens"], m_states, m_hidden), "metadata",
                        f"{meta['tokens']:,} tokens ({meta['tokens_from']} in {out}) x "
                        f"{factors(m_states, m_hidden, states_from, hidden_from)}, {PER_FILE}")
    if not hidden:
        return None
    samples, samples_from, max_len, len_from = upper_bound_inputs(ctx)
    if samples is None and meta.get("samples") is not None:
        samples, samples_from = meta["samples"], f"{meta['samples_from']} in {out}"
        if count(meta.get("max_seq_len")):
            max_len, len_from = int(meta["max_seq_len"]), "its max_seq_len"
    if samples is None:
        return None
    return Estimate(states_bytes(params, target, samples * max_len, aux + 1, hidden), "upper_bound",
                    f"{samples:,} samples ({samples_from}) x {max_len:,} tokens ({len_from}) x "
                    f"{factors(aux + 1, hidden)}, {PER_FILE}; prepare's summary gives the exact figure")


def format_line(ctx: EstimateContext) -> list[str]:
    """The disk estimate in each storage format, side by side (the format param picks one)."""
    from ops.hidden_formats import FORMATS
    from ops.units import human_bytes

    figures = []
    for fmt in FORMATS:
        est = extract_estimate(EstimateContext(ctx.root, dict(ctx.params, format=fmt), ctx.target, ctx.stage,
                                               ctx.upstream))
        if est is None:
            return []
        # bf16 keeps the states as computed: say the dtype where that is not bfloat16.
        dtype = state_dtype(ctx.params, ctx.target)
        said = f"{fmt} (as computed: {dtype})" if fmt == "bf16" and dtype != "bfloat16" else fmt
        figures.append(f"{said} {human_bytes(est.bytes)}")
    return [f"disk by format ({extract_estimate(ctx).label}): {' | '.join(figures)} "
            f"(this run: format = {state_format(ctx.params)})"]


def upper_bound_inputs(ctx: EstimateContext) -> tuple[int | None, str, int, str]:
    """(samples, where from, max_seq_len, where from) for extract's upper bound:
    its own num_samples / max_seq_len, and those of the prepare stage writing its input."""
    params = ctx.params
    max_len = count(params.get("max_seq_len")) or MAX_SEQ_LEN
    len_from = "extract's max_seq_len"
    samples = count(params.get("num_samples")) or None
    samples_from = "extract's num_samples"
    prep = ctx.upstream("input") if params.get("input") else None
    if prep is not None and prep.op == "prepare":
        p_len = count(prep.params.get("max_seq_len"))
        if p_len and p_len < max_len:
            max_len, len_from = p_len, f"{prep.name}'s max_seq_len"
        limit = count(prep.params.get("limit")) or None
        if limit is not None and (samples is None or limit < samples):
            samples, samples_from = limit, f"{prep.name}'s limit"
    summary = ctx.read_json("input", "summary.json")
    if samples is None and summary and count(summary.get("samples")) is not None:
        samples, samples_from = int(summary["samples"]), "prepare's summary.json"
    return samples, samples_from, max_len, len_from


_LENGTHS: dict[Path, tuple[tuple[int, int], int | None]] = {}


def tree_metadata(root: Path) -> dict[str, Any]:
    """What an existing hidden-state tree says about its size: tokens (data_config's
    total_tokens, else the sum of sample_lengths.json), samples (total_samples, or
    speculators' data.num_samples), hidden_size, num_layers_captured, max_seq_len."""
    config = read_data_config(root) or {}
    out: dict[str, Any] = {k: config.get(k) for k in ("hidden_size", "num_layers_captured", "max_seq_len")}
    tokens = count(config.get("total_tokens"))
    if tokens:
        out["tokens"], out["tokens_from"] = tokens, "data_config.json's total_tokens"
    else:
        summed = _lengths_total(Path(root) / SAMPLE_LENGTHS)
        if summed:
            out["tokens"], out["tokens_from"] = summed, SAMPLE_LENGTHS
    samples = count(config.get("total_samples"))
    data = config.get("data")
    if samples:
        out["samples"], out["samples_from"] = samples, "data_config.json's total_samples"
    elif isinstance(data, dict) and count(data.get("num_samples")):
        out["samples"], out["samples_from"] = int(data["num_samples"]), "data_config.json's data.num_samples"
    return out


def _lengths_total(path: Path) -> int | None:
    """The tokens sample_lengths.json lists, re-read only when the file changed."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size)
    cached = _LENGTHS.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        data = json.loads(path.read_text())
        total = sum(int(v) for v in data.values()) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError):
        total = None
    _LENGTHS[path] = (key, total)
    return total
