"""The pipeline file (eagle3.toml): parse, validate, and say clearly what is wrong.

Data flow: eagle3.toml -> Pipeline (this module) -> runs.launch / snapshot.collect.
Every error names the file, the key and what was expected; callers exit 3.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_console.kernel import configchecks
from eagle3_console.kernel.configchecks import MAX_DEPTH, too_deep
from eagle3_console.kernel.entry import EntryError
from eagle3_console.kernel import slurmparams as slurm_params
from eagle3_console.kernel.workspace import Workspace
from ops import KNOWN_OPS, get_spec
from ops.spec import ARGV_OP, DTYPE_BYTES, OpSpec

# `{{` and `}}` are literal braces in an argv (as in str.format); `{name}` a param.
ARGV_TOKEN_RE = re.compile(r"\{\{|\}\}|\{(\w+)\}")


def argv_params(part: str) -> list[str]:
    """The params an argv element names (escaped braces are none)."""
    return [m.group(1) for m in ARGV_TOKEN_RE.finditer(part) if m.group(1)]
TARGET_KEYS = {"path": str, "num_layers": int, "hidden_size": int, "dtype": str, "vocab_size": int,
               "architecture": str}
STAGE_KEYS = {"op", "argv", "params", "outputs", "gpus", "depends_on", "batch_param", "restart",
              "env", "description", "expected_samples", "estimate_bytes", "sample_glob", "launcher", "slurm"}
TOP_KEYS = {"target", "stages", "workspace", "hosts"}
# A pipeline has a handful of stages; a file of thousands is a generated
# mistake, and loading it would cost minutes on every `status` (seen: 200,000
# stages, 4 min, 1.3 GB). Refused before parsing the rest.
MAX_STAGES = 500
MAX_FILE_BYTES = 4 << 20
# A stage name becomes part of paths (its log, its trash folder) and argv words:
# one safe set, so no name climbs out (`../x`), nests (`a/b`), hides (`.x`) or reads as a flag (`-rf`).
STAGE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class ConfigError(ValueError):
    def __init__(self, file: Path | str, key: str, message: str):
        self.file, self.key = str(file), key
        super().__init__(f"{file}: {key}: {message}" if key else f"{file}: {message}")


@dataclass
class RestartPolicy:
    max: int = 0
    backoff_s: float = 30.0


@dataclass
class Stage:
    name: str
    op: str | None = None
    argv: list[str] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    gpus: list[int] | None = None
    depends_on: list[str] = field(default_factory=list)
    batch_param: str | None = None
    restart: RestartPolicy | None = None
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
    expected_samples: int | None = None
    estimate_bytes: int | None = None
    sample_glob: str | None = None      # a custom stage's sample files under its first output (fnmatch)
    launcher: str = "local"             # local (the supervisor's process group) | slurm (a job: runs/slurm/)
    slurm: Any = None                   # kernel/slurmparams.py SlurmParams of a slurm stage

    @property
    def spec(self) -> OpSpec:
        """The stage's op; a stage of its own argv gets the null op (ARGV_OP), whose hooks say nothing."""
        return get_spec(self.op) if self.op else ARGV_OP

    @property
    def batch_share(self) -> bool:
        """The batch param is a share of the GPU, not a count: its op's Param is
        bounded above by 1 (extract's mem_fraction_static). An OOM halves it too,
        since what SGLang does not reserve is what a forward's activations get."""
        declared = self.spec.params.declared.get(self.batch_param) if self.batch_param else None
        return declared is not None and declared.high is not None and declared.high <= 1

    def command(self, params: dict[str, Any], target: dict[str, Any]) -> list[str]:
        """The argv of a run with these params (never a shell string)."""
        if self.op:
            return self.spec.argv(params, target_path=target.get("path"), python=sys.executable)
        out = []
        for part in self.argv or []:
            out.append(ARGV_TOKEN_RE.sub(lambda m: m.group(0)[0] if not m.group(1)
                                         else _format_param(params, m.group(1), self.name), part))
        if out and out[0] in ("python", "python3"):
            out[0] = sys.executable   # the console's interpreter, so venvs behave
        return out

    def environment(self) -> dict[str, str]:
        env = dict(self.env)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        return env


def _format_param(params: dict[str, Any], name: str, stage: str) -> str:
    if name not in params:
        raise KeyError(f"stage {stage!r}: argv names {{{name}}} but no param {name!r} is set")
    value = params[name]
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


@dataclass
class Pipeline:
    path: Path
    target: dict[str, Any]
    stages: dict[str, Stage]
    hosts: list[str] = field(default_factory=list)     # other nodes' exporters (monitor/hosts.py)

    def order(self) -> list[str]:
        """Stage names in dependency order (file order among independent ones)."""
        done: list[str] = []
        pending = list(self.stages)
        while pending:
            for name in pending:
                if all(d in done for d in self.stages[name].depends_on):
                    done.append(name)
                    pending.remove(name)
                    break
        return done

    def stage(self, name: str) -> Stage:
        if name not in self.stages:
            known = ", ".join(self.stages) or "none"
            raise ConfigError(self.path, f"stages.{name}", f"no such stage (stages: {known})")
        return self.stages[name]


def _type_name(t: Any) -> str:
    return {str: "a string", int: "an integer", float: "a number", list: "a list",
            dict: "a table", bool: "true or false"}.get(t, str(t))


def _expect(file: Path, key: str, value: Any, t: Any) -> Any:
    ok = isinstance(value, t) and not (t in (int, float) and isinstance(value, bool))
    if t is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise ConfigError(file, key, f"expected {_type_name(t)}, got {type(value).__name__} {value!r}")
    return value


def _str_list(file: Path, key: str, value: Any) -> list[str]:
    _expect(file, key, value, list)
    for i, v in enumerate(value):
        _expect(file, f"{key}[{i}]", v, str)
    return list(value)


def parse_value(text: str) -> Any:
    """A `--set` value: TOML scalar when it parses (4, 0.85, true, "x", [1,2]), else the raw string."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        value = None
    if value is None or too_deep(value):
        raise ConfigError("--set", text[:40], f"nested more than {MAX_DEPTH} levels deep; expected at most {MAX_DEPTH}")
    if configchecks.nul_key(value):
        raise ConfigError("--set", text[:40].replace("\x00", "\\0"), "holds a NUL character; expected none")
    return value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", item, "expected name=value")
        out[key.strip()] = parse_value(value.strip())
    return out


def load(path: Path) -> Pipeline:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(path, "", f"{size:,} bytes; expected a pipeline file of at most {MAX_FILE_BYTES:,}")
        # utf-8-sig: a BOM (Windows editors write one) is dropped, not an "Invalid statement".
        raw = tomllib.loads(path.read_bytes().decode("utf-8-sig"))
    except RecursionError:
        raise ConfigError(path, "(syntax)", f"arrays or tables nested too deep; expected at most {MAX_DEPTH} "
                          "levels") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "(encoding)", f"not UTF-8: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}; "
                          "expected a UTF-8 text file") from None
    except FileNotFoundError:
        raise ConfigError(path, "", "no pipeline file here; pass -w DIR (or set EAGLE3_WORKSPACE) "
                          "for an existing workspace, or run `eagle3-console init DIR` to make one") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "(syntax)", str(exc)) from None
    except OSError as exc:
        raise ConfigError(path, "(file)", f"unreadable: {exc.strerror}") from None
    deep = too_deep(raw)
    if deep:
        raise ConfigError(path, deep, f"nested more than {MAX_DEPTH} levels deep; expected at most {MAX_DEPTH}")
    nul = configchecks.nul_key(raw)
    if nul:
        raise ConfigError(path, nul.replace("\x00", "\\0"), "holds a NUL character (\\u0000); expected none: "
                          "no program can be given one in its argv or environment")
    try:
        return parse(raw, path)
    except EntryError as exc:       # a part that its own module parses (hosts, a stage's launcher)
        raise ConfigError(path, exc.key, exc.message) from None


def parse(raw: dict[str, Any], path: Path) -> Pipeline:
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(path, key, f"unknown key; expected one of {sorted(TOP_KEYS)}")
    target = _parse_target(path, raw.get("target", {}))
    stages_raw = _expect(path, "stages", raw.get("stages", {}), dict)
    if len(stages_raw) > MAX_STAGES:
        raise ConfigError(path, "stages", f"{len(stages_raw):,} stages; expected at most {MAX_STAGES}")
    for name in stages_raw:
        if not STAGE_NAME_RE.fullmatch(name):
            raise ConfigError(path, f"stages.{json.dumps(name)}",
                              "unsafe stage name; expected 1-64 of letters, digits, _ . - (first a letter, digit "
                              "or _), e.g. extract_2 or bench-1.5")
    stages = {name: _parse_stage(path, name, body) for name, body in stages_raw.items()}
    pipe = Pipeline(path=path, target=target, stages=stages,
                    hosts=configchecks.parse_hosts(raw.get("hosts", [])))
    _check_graph(pipe)
    _check_outputs(pipe)
    return pipe


def _parse_target(path: Path, raw: Any) -> dict[str, Any]:
    _expect(path, "target", raw, dict)
    for key, value in raw.items():
        if key not in TARGET_KEYS:
            raise ConfigError(path, f"target.{key}", f"unknown key; expected one of {sorted(TARGET_KEYS)}")
        _expect(path, f"target.{key}", value, TARGET_KEYS[key])
    dtype = raw.get("dtype")
    if dtype is not None and dtype.lower().replace("torch.", "") not in DTYPE_BYTES:
        raise ConfigError(path, "target.dtype", f"{dtype!r} is not a dtype; expected one of {', '.join(DTYPE_BYTES)}")
    return dict(raw)


def _parse_stage(path: Path, name: str, body: Any) -> Stage:
    where = f"stages.{name}"
    _expect(path, where, body, dict)
    for key in body:
        if key not in STAGE_KEYS:
            raise ConfigError(path, f"{where}.{key}", f"unknown key; expected one of {sorted(STAGE_KEYS)}")
    has_op, has_argv = "op" in body, "argv" in body
    if has_op == has_argv:
        raise ConfigError(path, where, "expected exactly one of `op = \"<built-in op>\"` or `argv = [...]`")
    st = Stage(name=name)
    st.params = dict(_expect(path, f"{where}.params", body.get("params", {}), dict))
    if has_op:
        st.op = _expect(path, f"{where}.op", body["op"], str)
        try:
            spec = get_spec(st.op)
        except KeyError as exc:
            raise ConfigError(path, f"{where}.op", f"expected one of {', '.join(KNOWN_OPS)}: {exc.args[0]}") from None
        for key in st.params:
            if key not in spec.params:
                raise ConfigError(path, f"{where}.params.{key}",
                                  f"op {st.op!r} has no such param; it takes {sorted(spec.params)}")
            wrong = spec.param_type_error(key, st.params[key])
            if wrong:
                raise ConfigError(path, f"{where}.params.{key}", wrong)
        missing = spec.missing_params(st.params)
        if missing:
            raise ConfigError(path, f"{where}.params", f"op {st.op!r} requires {missing}")
        st.outputs = [str(st.params[p]) for p in spec.output_params if st.params.get(p)]
        st.batch_param = spec.batch_param
    else:
        st.argv = _str_list(path, f"{where}.argv", body["argv"])
        if not st.argv:
            raise ConfigError(path, f"{where}.argv", "expected a non-empty list (program first)")
        for part in st.argv:
            for pname in argv_params(part):
                if pname not in st.params:
                    raise ConfigError(path, f"{where}.argv", f"names {{{pname}}} but params has no {pname!r}")
    if "outputs" in body:
        st.outputs = _str_list(path, f"{where}.outputs", body["outputs"])
    if "gpus" in body:
        gpus = _expect(path, f"{where}.gpus", body["gpus"], list)
        st.gpus = [_expect(path, f"{where}.gpus[{i}]", g, int) for i, g in enumerate(gpus)]
        bad = next(configchecks.gpu_problems(st.gpus), None)
        if bad:
            raise ConfigError(path, f"{where}.gpus[{bad[0]}]", bad[1])
    st.depends_on = _str_list(path, f"{where}.depends_on", body.get("depends_on", []))
    if "batch_param" in body:
        st.batch_param = _expect(path, f"{where}.batch_param", body["batch_param"], str)
        if st.batch_param not in st.params and st.batch_param not in st.spec.params:
            raise ConfigError(path, f"{where}.batch_param", f"names {st.batch_param!r}, which is not in params")
    if "restart" in body:
        r = _expect(path, f"{where}.restart", body["restart"], dict)
        for key in r:
            if key not in ("max", "backoff_s"):
                raise ConfigError(path, f"{where}.restart.{key}", "unknown key; expected max or backoff_s")
        st.restart = RestartPolicy(max=_expect(path, f"{where}.restart.max", r.get("max", 0), int),
                                   backoff_s=_expect(path, f"{where}.restart.backoff_s", r.get("backoff_s", 30.0), float))
        for key, problem in (("max", configchecks.restart_max_problem(st.restart.max)),
                             ("backoff_s", configchecks.backoff_problem(st.restart.backoff_s))):
            if problem:
                raise ConfigError(path, f"{where}.restart.{key}", problem)
    env = _expect(path, f"{where}.env", body.get("env", {}), dict)
    st.env = {k: _expect(path, f"{where}.env.{k}", v, str) for k, v in env.items()}
    st.description = _expect(path, f"{where}.description", body.get("description", ""), str)
    if "expected_samples" in body:
        st.expected_samples = _expect(path, f"{where}.expected_samples", body["expected_samples"], int)
    if "estimate_bytes" in body:
        st.estimate_bytes = _expect(path, f"{where}.estimate_bytes", body["estimate_bytes"], int)
        if st.estimate_bytes < 0:
            raise ConfigError(path, f"{where}.estimate_bytes", f"expected a size in bytes >= 0, got {st.estimate_bytes}")
    if st.expected_samples is not None and st.expected_samples < 0:
        raise ConfigError(path, f"{where}.expected_samples", f"expected a count >= 0, got {st.expected_samples}")
    if "sample_glob" in body:
        glob = _expect(path, f"{where}.sample_glob", body["sample_glob"], str)
        if not glob or glob.startswith("/") or ".." in glob.split("/"):
            raise ConfigError(path, f"{where}.sample_glob",
                              f"{glob!r}: expected a pattern relative to the stage's first output, e.g. \"sample_*.bin\"")
        st.sample_glob = glob
    st.launcher, st.slurm = slurm_params.parse(where, body, st)
    return st


def _check_graph(pipe: Pipeline) -> None:
    for st in pipe.stages.values():
        for dep in st.depends_on:
            if dep not in pipe.stages:
                raise ConfigError(pipe.path, f"stages.{st.name}.depends_on",
                                  f"names {dep!r}, which is not a stage (stages: {', '.join(pipe.stages)})")
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = trail[trail.index(name):] + [name]
            raise ConfigError(pipe.path, f"stages.{name}.depends_on",
                              f"dependency cycle {' -> '.join(cycle)}; expected an acyclic graph")
        state[name] = 1
        for dep in pipe.stages[name].depends_on:
            visit(dep, trail + [name])
        state[name] = 2

    for name in pipe.stages:
        visit(name, [])


def _check_outputs(pipe: Pipeline) -> None:
    """Every output normalised once (`..` resolved), here: later steps use only
    the normalised path. An output that is the workspace, its state folder, or
    holds either is refused, and so is one inside another stage's."""
    ws = Workspace(pipe.path.parent.resolve())
    owned: list[tuple[Path, str]] = []
    guarded = ws.guarded()
    for st in pipe.stages.values():
        normal = []
        for out in st.outputs:
            p = ws.resolve(out)
            problem = ws.output_problem(p, guarded)
            if problem:
                key = "params" if st.op else "outputs"
                raise ConfigError(pipe.path, f"stages.{st.name}.{key}", f"output {out!r}: {problem}")
            normal.append(str(p))
            owned.append((p, st.name))
        st.outputs = normal
    # Each root against the roots above it, by lookup: a pairwise walk is quadratic in the stages.
    by_root: dict[Path, str] = {}
    for p, name in owned:
        by_root.setdefault(p, name)
    for p, name in owned:
        for q in (p, *p.parents):
            other = by_root.get(q)
            if other is not None and other != name:
                raise ConfigError(pipe.path, f"stages.{name}.outputs",
                                  f"{p} lies inside stage {other!r}'s output {q}; expected separate output roots")
