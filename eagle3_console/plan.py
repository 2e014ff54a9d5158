"""What a launch will need, said before it runs: the disk estimate, labelled by
how it was made, and the aux layer ids in the three spellings that get mixed up.

Where it sits: runs.estimate_bytes / runs.preflight (the disk check of `run`,
`restart`, watch and the TUI), snapshot (the disk rows of `status`, the JSON
and the TUI's disk pane) and `run`'s printed plan all take their figure from
disk_estimate(); runs.lints() adds layer_lints(). No torch, no textual.

An estimate is one of (Estimate.kind):
- "exact": the token count is known (prepare's summary.json, or the stage's
  `tokens` param): tokens x (aux layers + 1) x hidden_size x dtype bytes;
- "metadata": from the output tree's own records (a foreign tree: the seed's
  data_config.json `total_tokens` / `hidden_size` / `num_layers_captured`,
  speculators' `data.num_samples`, the tokens in sample_lengths.json);
- "upper_bound": no token count yet (prepare has not run): samples x
  max_seq_len x (aux layers + 1) x hidden_size x dtype bytes, every sample
  taken at its longest;
- "declared": the pipeline file's `estimate_bytes`;
- "estimate": another op's own rule (prepare: ~1.5 x its input, ...).
Once files land, the disk monitor's projection (written / fraction done) is
the "measured" figure (model.DiskUsage.final_kind).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_console.config import Pipeline, Stage
from eagle3_console.model import DiskUsage
from eagle3_console.units import human_bytes
from eagle3_console.workspace import Workspace
from ops import layers
from ops.formats import DATA_CONFIG, SAMPLE_LENGTHS
from ops.spec import EstimateContext, Lint, dtype_bytes, read_json_dict

KIND_LABEL = {"exact": "exact", "metadata": "from the tree's metadata", "upper_bound": "upper bound",
              "declared": "declared", "estimate": "estimate", "measured": "measured"}
OP_RULES = {"prepare": "about 1.5 x the input file's size",
            "vocab": "the draft/target id maps",
            "train": "drafter parameters x bytes per parameter x checkpoints kept",
            "export": "drafter parameters x dtype bytes x formats"}
PER_FILE = "plus per-file overhead (headers, input_ids, loss_mask)"


@dataclass(frozen=True)
class Estimate:
    bytes: int
    kind: str       # exact | metadata | upper_bound | declared | estimate (KIND_LABEL)
    basis: str      # how the figure was made, in words and factors

    @property
    def label(self) -> str:
        return KIND_LABEL.get(self.kind, self.kind)

    def describe(self) -> str:
        return f"{self.label} {human_bytes(self.bytes)} ({si_bytes(self.bytes)}) = {self.basis}"


def si_bytes(n: int) -> str:
    """Decimal units (what `df -H` and a disk's label say): 2.35 TB next to 2.1 TiB."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(value) < 1000 or unit == "PB":
            break
        value /= 1000
    if unit == "B":
        return f"{int(value)} B"
    return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"


# ------------------------------------------------------------------ disk
def disk_estimate(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> Estimate | None:
    """The best figure that can be made now for the stage's output, or None."""
    if stage.estimate_bytes is not None:
        return Estimate(stage.estimate_bytes, "declared", "estimate_bytes in the pipeline file")
    if stage.spec is None:
        return None
    if stage.op == "extract":
        return extract_estimate(ws, pipe, stage, params)
    n = stage.spec.estimate_bytes(EstimateContext(root=ws.root, params=params, target=pipe.target))
    if n is None:
        return None
    rule = OP_RULES.get(stage.op)
    return Estimate(int(n), "estimate", f"{stage.op}'s rule: {rule}" if rule else f"{stage.op}'s own estimate")


def _dtype(params: dict[str, Any], target: dict[str, Any]) -> str:
    dtype = params.get("dtype")
    return str(dtype if dtype not in (None, "auto") else target.get("dtype") or "bfloat16")


def _int(value: Any) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 and not isinstance(value, bool) else None


def extract_estimate(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> Estimate | None:
    from ops.extract.spec import aux_layer_count, estimate_bytes
    target = pipe.target
    ctx = EstimateContext(root=ws.root, params=params, target=target)
    dtype = _dtype(params, target)
    db = dtype_bytes(dtype)
    aux = aux_layer_count(params)
    hidden = _int(target.get("hidden_size"))

    def factors(states: int, hid: int, states_from: str = "", hidden_from: str = "") -> str:
        s = f"{states} states{states_from or f' ({states - 1} aux + final)'}"
        return f"{s} x {hid:,}{hidden_from} x {db} B ({dtype})"

    exact = estimate_bytes(ctx) if hidden else None
    if exact is not None:
        tokens = _int(params.get("tokens"))
        where = "the tokens param" if tokens else f"prepare's summary.json in {ctx.path('input')}"
        tokens = tokens or _int((ctx.read_json("input", "summary.json") or {}).get("total_tokens")) or 0
        return Estimate(int(exact), "exact", f"{tokens:,} tokens ({where}) x {factors(aux + 1, hidden)}")
    out = ctx.path("output")
    meta = tree_metadata(out) if out is not None else {}
    m_hidden = _int(meta.get("hidden_size")) or hidden
    m_states = _int(meta.get("num_layers_captured"))
    states_from = " (num_layers_captured)" if m_states else ""
    m_states = m_states or aux + 1
    if meta.get("tokens") is not None and m_hidden:
        hidden_from = " (its hidden_size)" if meta.get("hidden_size") else ""
        return Estimate(meta["tokens"] * m_states * m_hidden * db, "metadata",
                        f"{meta['tokens']:,} tokens ({meta['tokens_from']} in {out}) x "
                        f"{factors(m_states, m_hidden, states_from, hidden_from)}")
    if not hidden:
        return None
    samples, samples_from, max_len, len_from = upper_bound_inputs(ws, pipe, stage, params)
    if samples is None and meta.get("samples") is not None:
        samples, samples_from = meta["samples"], f"{meta['samples_from']} in {out}"
        if _int(meta.get("max_seq_len")):
            max_len, len_from = int(meta["max_seq_len"]), "its max_seq_len"
    if samples is None:
        return None
    return Estimate(samples * max_len * (aux + 1) * hidden * db, "upper_bound",
                    f"{samples:,} samples ({samples_from}) x {max_len:,} tokens ({len_from}) x "
                    f"{factors(aux + 1, hidden)}, {PER_FILE}; prepare's summary gives the exact figure")


def upper_bound_inputs(ws: Workspace, pipe: Pipeline, stage: Stage,
                       params: dict[str, Any]) -> tuple[int | None, str, int, str]:
    """(samples, where from, max_seq_len, where from) for extract's upper bound:
    its own num_samples / max_seq_len, and those of the prepare stage writing its input."""
    max_len = _int(stage.spec.effective(params).get("max_seq_len")) or 4096
    len_from = "extract's max_seq_len"
    samples = _int(params.get("num_samples")) or None
    samples_from = "extract's num_samples"
    prep = feeding_prepare(ws, pipe, params)
    if prep is not None:
        pp = prep.spec.effective(prep.params)
        p_len = _int(pp.get("max_seq_len"))
        if p_len and p_len < max_len:
            max_len, len_from = p_len, f"{prep.name}'s max_seq_len"
        limit = _int(pp.get("limit")) or None
        if limit is not None and (samples is None or limit < samples):
            samples, samples_from = limit, f"{prep.name}'s limit"
    summary = EstimateContext(root=ws.root, params=params, target=pipe.target).read_json("input", "summary.json")
    if samples is None and summary and _int(summary.get("samples")) is not None:
        samples, samples_from = int(summary["samples"]), "prepare's summary.json"
    return samples, samples_from, max_len, len_from


def feeding_prepare(ws: Workspace, pipe: Pipeline, params: dict[str, Any]) -> Stage | None:
    """The prepare stage whose output is this stage's input."""
    if not params.get("input"):
        return None
    want = ws.resolve(str(params["input"]))
    for other in pipe.stages.values():
        if other.op == "prepare" and other.params.get("output") and ws.resolve(str(other.params["output"])) == want:
            return other
    return None


_LENGTHS: dict[Path, tuple[tuple[int, int], int | None]] = {}


def tree_metadata(root: Path) -> dict[str, Any]:
    """What an existing hidden-state tree says about its size: tokens (data_config's
    total_tokens, else the sum of sample_lengths.json), samples (total_samples, or
    speculators' data.num_samples), hidden_size, num_layers_captured, max_seq_len."""
    config = read_json_dict(Path(root) / DATA_CONFIG) or {}
    out: dict[str, Any] = {k: config.get(k) for k in ("hidden_size", "num_layers_captured", "max_seq_len")}
    tokens = _int(config.get("total_tokens"))
    if tokens:
        out["tokens"], out["tokens_from"] = tokens, "data_config.json's total_tokens"
    else:
        summed = _lengths_total(Path(root) / SAMPLE_LENGTHS)
        if summed:
            out["tokens"], out["tokens_from"] = summed, SAMPLE_LENGTHS
    samples = _int(config.get("total_samples"))
    data = config.get("data")
    if samples:
        out["samples"], out["samples_from"] = samples, "data_config.json's total_samples"
    elif isinstance(data, dict) and _int(data.get("num_samples")):
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


# ------------------------------------------------------------------ layers
def _layer_ids(pipe: Pipeline, params: dict[str, Any]) -> tuple[list[int] | None, int | None]:
    """(canonical ids, num_layers); ValueError for ids the target cannot have."""
    n = _int(pipe.target.get("num_layers"))
    value = params.get("layer_ids", "auto")
    if n is None:
        if isinstance(value, str) and value.strip().lower() in ("", "auto"):
            return None, None
        return layers.parse_layer_ids(value, 1 << 30), None
    return layers.parse_layer_ids(value, n), n


def layer_line(pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> str | None:
    """The aux layers in the three spellings, side by side (an extract stage's)."""
    if stage.op != "extract":
        return None
    try:
        ks, n = _layer_ids(pipe, params)
    except ValueError as exc:
        return f"layers: {exc}"
    if ks is None:
        return "layers: auto ([target].num_layers is not set: the target's config.json decides at run time)"
    final = f" + final {n - 1}" if n else ""
    return (f"layers ({n if n else '?'}-layer target): canonical {ks}{final} | SGLang capture / "
            f"eagle_aux_hidden_state_layer_ids {layers.sglang_capture_ids(ks)} | "
            f"HF hidden_states index {layers.hf_hidden_states_indices(ks)}")


def layer_lints(pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> list[Lint]:
    """Ids the target cannot have (error), and the classic off-by-one: ids equal to
    the SGLang spelling of the default (warning naming both readings)."""
    if stage.op != "extract":
        return []
    try:
        ks, n = _layer_ids(pipe, params)
    except ValueError as exc:
        return [Lint("error", f"stages.{stage.name}.params.layer_ids: {exc}")]
    if ks is None or n is None:
        return []
    try:
        default = layers.default_aux_layers(n)
    except ValueError:
        return []
    sglang_default = layers.sglang_capture_ids(default)
    if ks != sglang_default or ks == default:
        return []
    return [Lint("warning", (
        f"stages.{stage.name}.params.layer_ids {ks} is read as canonical ids (the OUTPUT of decoder layers {ks}; "
        f"SGLang capture {layers.sglang_capture_ids(ks)}); it equals SGLang's default capture list "
        f"(layers_to_capture / eagle_aux_hidden_state_layer_ids) for a {n}-layer target, which is canonical "
        f"{default}: if you copied SGLang's list, write {default} (or \"auto\")"))]


# ------------------------------------------------------------------ run's plan
def disk_line(pf: Any) -> str | None:
    """runs.Preflight in a line: the estimate with its kind and basis, the free space, the verdict."""
    est = getattr(pf, "estimate", None)
    if est is None:
        return None
    line = f"disk: {est.describe()}"
    if pf.written_bytes:
        line += f"; {human_bytes(pf.written_bytes)} already written, {human_bytes(pf.remaining_bytes)} to go"
    if pf.free_bytes is not None:
        verdict = "fits" if pf.fits else "does NOT fit"
        line += f"; {human_bytes(pf.free_bytes)} free at {pf.path}: {verdict}"
    return line


def launch_lines(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> list[str]:
    """What `run` prints before it launches or refuses: disk, layers."""
    from eagle3_console import runs
    out = []
    try:
        line = disk_line(runs.preflight(ws, pipe, stage, params))
    except (runs.Refused, OSError):
        line = None     # launch says what is wrong with the outputs
    if line:
        out.append(line)
    line = layer_line(pipe, stage, params)
    if line:
        out.append(line)
    return out


def downstream(pipe: Pipeline, name: str) -> list[str]:
    """The stages that depend on `name`, directly or through others, in pipeline order."""
    found = {name}
    for other in pipe.order():
        if found & set(pipe.stages[other].depends_on):
            found.add(other)
    return [n for n in pipe.order() if n in found and n != name]


def rerun_warnings(ws: Workspace, pipe: Pipeline, stage: Stage) -> list[str]:
    """`run` on a stage whose last run succeeded: what the TUI's start dialog asks, said
    (its outputs are complete; the downstream stages with complete outputs become stale)."""
    from eagle3_console.registry import Registry, id_path
    if not (ws.db_path.exists() or id_path(ws.db_path).exists()):
        return []
    with Registry(ws.db_path) as reg:
        last = reg.latest(stage.name)
        if last is None or last.status != "succeeded":
            return []
        complete = [n for n in downstream(pipe, stage.name)
                    if (r := reg.latest(n)) is not None and r.status == "succeeded"]
    stale = ("makes stale (their outputs were made from the current ones): " + ", ".join(complete) if complete
             else "no downstream stage has complete outputs: none becomes stale")
    return [f"warning: {stage.name}'s last run {last.id} succeeded: its outputs are complete and this run goes "
            f"into them (an op that resumes, like extract, skips what is there; others rewrite their files); "
            + stale]


def unwritten_usage(stage: str, path: str, estimate_bytes: int) -> DiskUsage:
    """The disk row of an output nothing was written to yet: the estimate against the free space."""
    from eagle3_console.monitor.disk import free_space
    try:
        free, total = free_space(path)
    except OSError:
        free = total = None
    return DiskUsage(stage=stage, path=path, estimate_bytes=estimate_bytes, free_bytes=free, total_bytes=total,
                     fits=None if free is None else estimate_bytes <= free)


def label_usages(usages: list[DiskUsage], est: Estimate | None) -> None:
    """Say on each disk row how its estimate was made, and which figure its verdict used."""
    for d in usages:
        if d.estimate_bytes is not None and est is not None:
            d.estimate_kind, d.estimate_basis = est.kind, est.basis
        d.final_kind = "measured" if d.projected_bytes is not None else d.estimate_kind
