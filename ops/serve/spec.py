"""Spec of the serve stage: `python -m ops.serve` lints, then becomes `python -m sglang.launch_server`.

No outputs: the stage is the server. Its state (loading -> warming up ->
ready -> unhealthy) is sampled by eagle3_console/monitor/serve.py from the
log and from the server's own HTTP endpoints. The model defaults to
[target].path (passed as --target).
"""

from __future__ import annotations


from ops.serve import command
from ops.serve.readiness import SERVE_READY_TIMEOUT_S
from ops.spec import EstimateContext, Lint, OpSpec, Server


def lint(ctx: EstimateContext, gpus: list[int] | None) -> list[Lint]:
    """The stage's lints for the plan (`run` prints them; errors refuse the launch).
    Paths resolve against the workspace, as the supervisor's cwd makes them at run time."""
    params = dict(ctx.params)
    params.setdefault("model_path", None)
    if not params["model_path"]:
        params["model_path"] = ctx.target.get("path")
    resolved = EstimateContext(root=ctx.root, params=params, target=ctx.target)
    model = resolved.path("model_path")
    if params.get("drafter"):
        params["drafter"] = str(resolved.path("drafter"))
    return command.lint(params, str(model) if model else None, gpus, ctx.target)


def server(params: dict) -> Server:
    """Where the server listens and what it serves, from the stage's effective params
    (the snapshot's ServeMonitor, a bench bound to it, a dependency on it)."""
    rts = params.get("ready_timeout_s")
    return Server(host=str(params.get("host") or "127.0.0.1"), port=int(params.get("port") or SPEC.params["port"]),
                  mode=params.get("mode"), ready_timeout_s=float(rts) if rts else None)


SPEC = OpSpec(
    name="serve",
    summary="a managed SGLang server (python -m sglang.launch_server): the target alone or speculative EAGLE3",
    params={
        "model_path": None,         # default: [target].path
        "tp": 1,
        "dp": 1,
        "ep": 1,
        "host": "127.0.0.1",
        "port": 30000,
        "mem_fraction_static": None,
        "context_length": None,
        "mode": "target",           # target | speculative
        "drafter": None,            # export's output directory (its sglang/ folder)
        "speculative_algorithm": "EAGLE3",
        "num_steps": 3,
        "topk": 1,
        "num_draft_tokens": 4,
        "enable_metrics": True,
        "extra_args": None,         # a list of argv words passed to SGLang as they are
        "ready_timeout_s": SERVE_READY_TIMEOUT_S,   # the console's: not ready by then is CRITICAL
        "force": False,             # start despite lint errors (`run --force` sets it)
        "launcher": command.SGLANG_LAUNCHER,   # module run as `python -m`; tests use a fake
    },
    uses_target=True,
    uses_gpu=True,
    progress="log",
    json_params=("extra_args",),
    lint=lint,
    serves=server,
)
