"""A run's params: the stage's (or the run it restarts) with the overrides,
each checked against its type (stage_params); a param naming a serve stage
binds that server's URL (bind_servers: the spec's server_params).

A param's value is also checked where the op's own check is lenient: a quoted
number (`tp = "8"`) for a numeric param (quoted_number), for every param of an
op stage and every override of a custom one.
"""

from __future__ import annotations

from typing import Any

from eagle3_console.kernel.config import Pipeline, Stage
from eagle3_console.kernel.refused import Refused
from ops.spec import value_type_error


def quoted_number(default: Any, param: Any, value: Any) -> str | None:
    """A string where a number is wanted (`tp = "8"` in the pipeline file, `--set tp='"8"'`):
    the op's argparse would take "8", but the console would carry and compare a
    string (the plan, tp x dp against the GPUs, a restart's halving). Said with the
    fix; None when `value` is no quoted number or the param takes text."""
    if param is not None:
        if param.convert is not None or param.const is not None:
            return None
        kind = param.kind
        default = param.default
    else:
        kind = type(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else None
    if kind not in (int, float) or not isinstance(value, str):
        return None
    return (f"expected {'an integer' if kind is int else 'a number'} (default {default!r}), got the string "
            f"{value!r}: write it without quotes")


def stage_params(stage: Stage, overrides: dict[str, Any] | None = None, base: dict | None = None,
                 pipe: Pipeline | None = None) -> dict[str, Any]:
    """A run's params: the stage's (or a base run's) with overrides, checked;
    with `pipe`, a param naming a serve stage (bench's server) binds its URL."""
    params = dict(stage.params if base is None else base)
    params.update(overrides or {})
    if not stage.spec.builtin:
        # A custom stage takes the params its pipeline entry declares (their
        # types are its program's business: a default of 3 may well take 1.5).
        unknown = sorted(set(overrides or {}) - set(stage.params))
        if unknown:
            raise Refused(f"stages.{stage.name}: no param(s) {unknown}; it takes {sorted(stage.params)} "
                          f"(declared in its params = {{...}})", code=3, kind="params")
        # An override takes the type of the declared default (README): a typo
        # fails here, not minutes later in the program (and again on restart).
        for key, value in (overrides or {}).items():
            wrong = value_type_error(stage.params[key], value) or quoted_number(stage.params[key], None, value)
            if wrong:
                raise Refused(f"stages.{stage.name}: param {key}: {wrong}", code=3, kind="params")
    else:
        unknown = sorted(set(params) - set(stage.spec.params))
        if unknown:
            raise Refused(f"op {stage.op!r} has no param(s) {unknown}; it takes {sorted(stage.spec.params)}", code=3,
                          kind="params")
        for key, value in params.items():
            wrong = stage.spec.param_type_error(key, value) or quoted_number(
                None, stage.spec.params.declared.get(key), value)
            if wrong:
                raise Refused(f"stages.{stage.name}: param {key}: {wrong}", code=3, kind="params")
        if pipe is not None:
            bind_servers(pipe, stage, params, overrides or {})
    batch = (overrides or {}).get(stage.batch_param) if stage.batch_param else None
    if isinstance(batch, (int, float)) and not isinstance(batch, bool) and not batch >= 1 and not stage.batch_share:
        # A batch of 0 starts a run that does nothing (or divides by it); halving never goes below 1.
        # Only what --set gives: a pipeline file may use a sentinel (-1: "the program decides").
        raise Refused(f"stages.{stage.name}: param {stage.batch_param}: {batch!r}: expected a batch of at least 1 "
                      f"(it is the stage's batch_param)", code=3, kind="params")
    return params


def bind_servers(pipe: Pipeline, stage: Stage, params: dict[str, Any], overrides: dict[str, Any]) -> None:
    """The op's server_params (bench's): a serving stage named there gives the
    URL its host and port make, each launch (a restart follows the serve
    stage's current port)."""
    for want in stage.spec.server_params:
        names = params.get(want.name_param)
        if not names:
            continue
        # Several serve stages, comma-separated (bench: one server per speculative setting): URLs alike.
        urls = [_server_url(pipe, stage, want, name.strip(), overrides) for name in str(names).split(",")]
        params[want.url_param] = ",".join(urls)


def _server_url(pipe: Pipeline, stage: Stage, want, name: str, overrides: dict[str, Any]) -> str:
    where = f"stages.{stage.name}.params.{want.name_param}"
    serve = pipe.stages.get(name)
    server = serve.spec.serves(serve.spec.effective(serve.params)) if serve is not None else None
    if server is None:
        names = [s.name for s in pipe.stages.values() if s.spec.serves(s.spec.effective(s.params)) is not None]
        raise Refused(f"{where}: {name!r} is not a serve stage (serve stages: {', '.join(names) or 'none'})",
                      code=3)
    if server.mode != want.mode:
        raise Refused(f"{where}: serve stage {name!r} has mode {server.mode!r}; {want.name_param} needs a "
                      f"{want.mode!r} server", code=3)
    if want.url_param in overrides:
        raise Refused(f"{where} names a serve stage and {want.url_param} is set too; set one of them", code=3)
    from eagle3_console.monitor.serve import server_url    # serve stages only
    return server_url(server.host, server.port)
