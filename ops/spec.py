"""What the console needs to know about a stage without running it.

An OpSpec says which params an op takes (and so how to build its argv),
which params name its outputs, how big its output will be, how many samples
it will produce, and which files under an output root are partial leftovers.
Importing a spec must stay cheap: no torch, no transformers.

Its hooks (its methods, each with the answer of an op that has nothing to say)
are what the console asks in place of knowing an op: a new stage, or a new
figure of one, is a method of its own spec's class.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ops.common import read_json
from ops.params import REQUIRED, Param, ParamSet  # noqa: F401 - REQUIRED and Param are the specs' words

if TYPE_CHECKING:
    from ops.estimate import Estimate

DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
               "float32": 4, "fp32": 4, "float": 4, "float8_e4m3fn": 1, "fp8": 1}


@dataclass(frozen=True)
class Upstream:
    """The pipeline stage whose output a param's path is (EstimateContext.upstream)."""

    name: str
    op: str | None
    params: dict[str, Any]          # its effective params (OpSpec.effective)


def _no_upstream(_key: str) -> Upstream | None:
    return None


@dataclass(frozen=True)
class EstimateContext:
    """Inputs of the estimate functions: resolved params and the [target] table."""

    root: Path                      # the workspace root; relative paths resolve here
    params: dict[str, Any]
    target: dict[str, Any]          # path, num_layers, hidden_size, dtype, vocab_size
    stage: str = ""                 # the stage's name, for messages (stages.<name>.params.x)
    # The stage of the pipeline writing the path param `key` names (extract's
    # input: a prepare stage's output), or None; the console answers (plan.context).
    upstream: Callable[[str], Upstream | None] = _no_upstream

    def path(self, key: str) -> Path | None:
        value = self.params.get(key)
        if value in (None, ""):
            return None
        p = Path(str(value)).expanduser()
        return p if p.is_absolute() else self.root / p

    def read_json(self, key: str, name: str) -> dict | None:
        """`<param key's path>/<name>` parsed, or None when absent or unreadable."""
        base = self.path(key)
        return None if base is None else read_json(base / name)


class OpSpec:
    """A stage's op as the console sees it, without running it: a base class whose
    hooks answer for an op that has nothing to say (harlequin's adapter pattern).
    Each ops/<op>/spec.py subclasses it, its Params and its hooks side by side,
    and its module's SPEC is one instance; a stage of the pipeline file's own
    argv (no op) gets ArgvOp's, so the console asks every stage alike."""

    name: str = ""
    summary: str = ""
    # Every accepted param (ops/params.py): a tuple of Param, or a plain
    # {name: default} mapping (types from the defaults); kept as a ParamSet,
    # which reads as {name: default}. A default of REQUIRED means required.
    params: ParamSet = ParamSet(())
    # Params whose values are output paths (relative to the workspace root).
    output_params: tuple[str, ...] = ()
    # Params naming paths the op reads, which must exist before it is launched
    # (runs.launch refuses a missing one instead of starting N ranks that fail on it).
    input_params: tuple[str, ...] = ()
    # Whether the op takes `--target PATH` (the [target] table's path is passed).
    uses_target: bool = False
    # The param that sets batch size / token budget, halved after an OOM.
    batch_param: str | None = None
    # "shards": progress counted from sample files under the first output;
    # "log": progress parsed from the log's tqdm / summary lines.
    progress: str = "log"
    # The stage's own record of what it did, under its first output (JSON, or
    # JSON lines: the last one); result_line says it in one line for the console.
    result_file: str | None = None
    # Or a param naming the record's path (verify writes no output but its report).
    result_path_param: str | None = None
    # Module run as `python -m <module>`; defaults to ops.<name>.
    module: str | None = None
    # plan.disk_estimate's words for estimate_bytes' rule ("about 1.5 x the input file's size").
    estimate_rule: str | None = None
    # Params naming a serving stage whose URL another param gets (bench's server -> url): runs/params.py bind_servers.
    server_params: tuple[ServerParam, ...] = ()
    # Step records under the first output the console plots (monitor/metrics.py: train's metrics.jsonl).
    curves: CurveSource | None = None
    # A report on another stage's output naming its bad files (verify's), which
    # `clean` may offer even under that stage's succeeded run (actions/clean.py).
    bad_files: BadFiles | None = None
    # A built-in op (False: ArgvOp, a stage of the pipeline file's own argv).
    builtin: bool = True
    # The files under its output are its progress: an earlier run's count for the
    # next (extract resumes from them), and a count of none is none done.
    output_is_progress: bool = True

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if not isinstance(cls.params, ParamSet):
            cls.params = ParamSet(cls.params)

    def __repr__(self) -> str:
        return f"<op {self.name or '(argv)'}>"

    # ---- hooks: what the console asks the op instead of knowing it.
    def estimate_bytes(self, ctx: EstimateContext) -> int | None:
        """The output's size by the op's rule, or None."""
        return None

    def expected_samples(self, ctx: EstimateContext) -> int | None:
        return None

    def expected_tokens(self, ctx: EstimateContext) -> int | None:
        return None

    def partial_files(self, root: Path) -> list[Path]:
        """Files under an output root that are partial leftovers (what `clean` moves)."""
        return []

    def estimate(self, ctx: EstimateContext) -> Estimate | None:
        """plan.disk_estimate: the figure with its kind and basis (ops/estimate.py);
        by default estimate_bytes' number, labelled an estimate by estimate_rule."""
        n = self.estimate_bytes(ctx)
        if n is None:
            return None
        from ops.estimate import Estimate

        rule = self.estimate_rule
        return Estimate(int(n), "estimate", f"{self.name}'s rule: {rule}" if rule else f"{self.name}'s own estimate")

    def result_line(self, record: dict) -> str | None:
        """The record (result_file's) in one line for the console: None when it says nothing."""
        return None

    def result_view(self, record: dict) -> ResultView | None:
        """The record as the TUI's panes show it (the snapshot carries it): None when it says nothing."""
        return None

    def gauges(self, record: dict) -> list[Gauge]:
        """The record's figures for the Prometheus exporter: [] when it has none."""
        return []

    def launch(self, params: dict[str, Any], argv: list[str]) -> list[str]:
        """How the op's processes are started, given its params and its `python -m`
        argv (extract with engine sglang and tp > 1 runs one process per TP rank
        under torchrun); by default the argv as it is."""
        return argv

    def output_values(self, params: dict[str, Any], declared: list[str]) -> list[str]:
        """The stage's output roots as written (not yet resolved): its output_params'
        values; `declared` (the stage's own `outputs`) serves a stage of its own argv."""
        return [str(params[p]) for p in self.output_params if params.get(p)]

    def partial_rule(self, declared_samples: int | None) -> Callable[[Path], list[Path]] | None:
        """How `clean` finds partial leftovers under an output root (the op's: partial_files);
        None: no rule knows them, its runs' manifests say which files are whose."""
        return self.partial_files

    def shard_progress(self, expected_samples: int | None) -> bool:
        """Whether progress is counted from sample files under the first output."""
        return self.progress == "shards"

    def spreads(self, params: dict[str, Any]) -> str | None:
        """How the op spreads over several nodes (a slurm stage's nodes, gpus_per_node),
        given its params: "torchrun" (torch.distributed's RANK / WORLD_SIZE), "sglang"
        (SGLang's own --nnodes / --node-rank / --dist-init-addr, through its extra_args
        param); None: one process on one node."""
        return None

    def one_node(self, params: dict[str, Any]) -> bool:
        """Whether it runs as one process on one node (a slurm stage of several
        nodes is refused): an op that says no way to spread (spreads: None)."""
        return self.spreads(params) is None

    def lint(self, ctx: EstimateContext, gpus: list[int] | None) -> list[Lint]:
        """runs.lints (`run`, before a launch): what is wrong with the params; an error refuses."""
        return []

    def plan_lines(self, ctx: EstimateContext) -> list[str]:
        """plan.launch_lines: more lines `run` prints before it launches (extract's aux layers)."""
        return []

    def serves(self, params: dict[str, Any]) -> Server | None:
        """A serving stage (serve): where its server listens, from its effective
        params. snapshot probes it (monitor/serve.py), runs binds ServerParams to
        it, and a dependency on it means "its server is ready" (serve_deps.py).
        None: no server."""
        return None

    @property
    def json_params(self) -> tuple[str, ...]:
        """Params whose value is a list of argv words (SGLang's extra_args,
        declared `Param(json=True)`): carried as the JSON of the list, since the
        comma join of other lists would split `--json-model-override-args {...}`
        at its own commas."""
        return tuple(k for k, p in self.params.declared.items() if p.json)

    def effective(self, params: dict[str, Any]) -> dict[str, Any]:
        """The params a run of this op gets: its defaults, then the stage's
        (the one place they merge: argv, snapshot, restart and the TUI)."""
        return {**self.params.defaults(), **params}

    def argv(self, params: dict[str, Any], target_path: str | None = None,
             python: str | None = None) -> list[str]:
        """The full command line. Params become `--key-with-dashes value`;
        True becomes a bare flag, False/None are left out (False is `--no-key`
        where the default is True), lists are joined
        with commas. Unknown params are an error (caught by config too)."""
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise ValueError(f"op {self.name!r} has no param(s) {unknown}; "
                             f"it takes {sorted(self.params)}")
        python = python or sys.executable
        out = [python, "-m", self.module or f"ops.{self.name}"]
        if self.uses_target and target_path:
            out += ["--target", str(target_path)]
        merged = self.effective(params)
        for key in sorted(merged):
            value = merged[key]
            flag = "--" + key.replace("_", "-")
            if value is True:
                out.append(flag)
            elif value is False and self.params.get(key) is True:
                out.append("--no-" + key.replace("_", "-"))    # off, where the op's default is on
            elif value is False or value is None:
                continue
            elif key in self.json_params:
                if value:
                    out += [flag, json.dumps(list(value)) if isinstance(value, (list, tuple)) else str(value)]
            elif isinstance(value, (list, tuple)):
                out += [flag, ",".join(str(v) for v in value)]
            else:
                out += [flag, str(value)]
        return self.launch(merged, out)

    def param_type_error(self, key: str, value: Any) -> str | None:
        """What is wrong with `value` for param `key`, judged by the type of its
        default (an op's argparse would refuse it only once the run started;
        a restart would then carry the typo again). None when it is fine."""
        return self.params.check(key, value)

    def missing_params(self, params: dict[str, Any]) -> list[str]:
        return [k for k in self.params.required() if k not in params]


class ArgvOp(OpSpec):
    """The null op of a stage of the pipeline file's own argv: no params of an op,
    no hooks; its argv and outputs are the stage's (eagle3_console/kernel/config.py).
    Of a program it does not know, it answers from what the stage's entry declares."""

    builtin = False
    # Its output may hold a previous run's files (an OOM restart, a rerun): only its
    # run's own count, and one that found none says nothing (its log does).
    output_is_progress = False

    def output_values(self, params: dict[str, Any], declared: list[str]) -> list[str]:
        return list(declared)

    def partial_rule(self, declared_samples: int | None) -> Callable[[Path], list[Path]] | None:
        """A stage that declares expected_samples writes the hidden-state layout:
        its whole samples are resume points, the rest is partial (ops/formats.py)."""
        from ops.formats import partial_samples

        return partial_samples if declared_samples is not None else None

    def shard_progress(self, expected_samples: int | None) -> bool:
        """Counted from its sample files where it says how many to expect."""
        return expected_samples is not None

    def one_node(self, params: dict[str, Any]) -> bool:
        """Its own program spreads as it likes (srun, its own launcher)."""
        return False


ARGV_OP = ArgvOp()


def value_type_error(default: Any, value: Any) -> str | None:
    """`value` against the type of `default` (a custom stage's declared params,
    which have no Param): Param's own check, so both speak alike."""
    return Param("value", default, finite=False).check(value)


def dtype_bytes(dtype: str | None) -> int:
    return DTYPE_BYTES.get(str(dtype or "bfloat16").lower().replace("torch.", ""), 2)


@dataclass(frozen=True)
class Lint:
    """One finding of an op's lint (OpSpec.lint(ctx, gpus) -> [Lint]),
    run before a launch: `run` prints each; an error refuses the launch (exit 3)."""

    level: str      # "error" | "warning"
    message: str
    # --force launches past an error (a dependency, a check that may be wrong), never past a
    # param that cannot work (ids the target has not, an output holding other layers): the op
    # would refuse it itself, after N ranks and the model's load.
    forceable: bool = True

    def __str__(self) -> str:
        return f"{self.level}: {self.message}"


def refusing(lints: list[Lint], force: bool) -> list[Lint]:
    """The lints that refuse a launch: every error, and with --force those it cannot skip."""
    return [x for x in lints if x.level == "error" and not (force and x.forceable)]


@dataclass(frozen=True)
class Server:
    """Where a serving stage's server listens (OpSpec.serves): what the
    console's ServeMonitor probes and what a ServerParam binds to."""

    host: str
    port: int
    mode: str | None                        # what it serves: "target" | "speculative"
    ready_timeout_s: float | None = None    # not ready by then is CRITICAL (None: the monitor's default)


@dataclass(frozen=True)
class ServerParam:
    """A param naming a serving stage of the pipeline (bench's `server`): each
    launch binds `url_param` to that stage's URL, and the stage must serve `mode`."""

    name_param: str
    url_param: str
    mode: str


@dataclass(frozen=True)
class Gauge:
    """One figure of a stage's record for the exporter (OpSpec.gauges); a None value is no sample."""

    name: str
    doc: str
    value: Any
    labels: tuple[tuple[str, str], ...] = ()    # added to the stage's own labels


@dataclass(frozen=True)
class ResultView:
    """A stage's record as the TUI's panes show it (OpSpec.result_view).

    Styles are roles the panes colour: "label", "strong", "headline", "ok",
    "alarm", "warn" ("" is plain)."""

    head: tuple[tuple[str, str], ...]               # (text, role): the progress pane's head
    bars: tuple[tuple[str, float | None], ...] = ()  # (label, fraction 0..1) under the progress bars
    details: tuple[str, ...] = ()                   # lines under the bars
    cell: tuple[str, str] | None = None             # (text, "ok" | "alarm"): the stages table's result column


@dataclass(frozen=True)
class CurvePoint:
    step: int
    loss: float
    acc: tuple[float, ...]          # per TTT step (NaN where not a number)
    sim_al: float | None


@dataclass(frozen=True)
class CurveSource:
    """JSON lines under the stage's first output whose records are curve points (OpSpec.curves)."""

    file: str
    point: Callable[[dict], CurvePoint | None]      # a record as a curve point, None to skip it


@dataclass(frozen=True)
class BadFiles:
    """A stage whose report names bad files of another stage's output (OpSpec.bad_files)."""

    output_param: str       # the param naming the output judged (verify's input)
    report_param: str       # the param naming the report
    # (report, output, base: the directory the stage ran in) -> the bad files still
    # there unchanged, each with a .path; [] when the report cannot be read.
    read: Callable[[Path, Path, Path], list]
