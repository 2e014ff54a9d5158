"""Spec of the serve stage: `python -m ops.serve` lints, then becomes `python -m sglang.launch_server`.

No outputs: the stage is the server. Its state (loading -> warming up ->
ready -> unhealthy) is sampled by eagle3_console/monitor/serve.py from the
log and from the server's own HTTP endpoints. The model defaults to
[target].path (passed as --target).
"""

from __future__ import annotations


from ops.serve import command
from ops.readiness import SERVE_READY_TIMEOUT_S
from ops.spec import EstimateContext, Lint, OpSpec, Param, Server


class Serve(OpSpec):
    name = "serve"
    summary = "a managed SGLang server (python -m sglang.launch_server): the target alone or speculative EAGLE3"
    params = (
        Param("model_path", None, "the model (default: [target].path, passed as --target)", type=str),
        Param("tp", 1, "tensor parallel size", low=1),
        Param("dp", 1, "data parallel replicas", low=1),
        Param("ep", 1, "expert parallel size (MoE; ep x moe_dp_size = tp)", low=1),
        Param("host", "127.0.0.1", "address the server listens on"),
        Param("port", 30000, "port the server listens on", low=1, high=65535),
        Param("mem_fraction_static", None, "share of each GPU for weights and KV cache (default: SGLang's)",
              type=float, low=0, low_open=True, high=1, high_open=True),
        Param("context_length", None, "the model's context length (default: its config's)", type=int, low=1),
        Param("mode", "target", "target: the target alone; speculative: with the EAGLE3 drafter",
              choices=command.MODES),
        Param("drafter", None, "export's output directory (its sglang/ folder)", type=str),
        Param("speculative_algorithm", "EAGLE3", "SGLang's --speculative-algorithm", choices=command.ALGORITHMS),
        Param("num_steps", 3, "draft steps a verify (--speculative-num-steps)", low=1),
        Param("topk", 1, "drafts kept a step (--speculative-eagle-topk)", low=1),
        Param("num_draft_tokens", 4, "tokens verified a step (--speculative-num-draft-tokens)", low=1),
        Param("enable_metrics", True, "SGLang's Prometheus /metrics (the console reads it)"),
        Param("extra_args", None, "JSON list of argv words passed to SGLang as they are", json=True),
        Param("ready_timeout_s", SERVE_READY_TIMEOUT_S, "the console's: not ready this long after the start "
              "is CRITICAL (not passed to SGLang)", low=0, low_open=True),
        Param("force", False, "exec the server despite lint errors (`run --force` sets it)"),
        Param("launcher", command.SGLANG_LAUNCHER, "module run as `python -m` (tests use a fake)"),
    )
    uses_target = True

    def lint(self, ctx: EstimateContext, gpus: list[int] | None) -> list[Lint]:
        """The stage's lints for the plan (`run` prints them; errors refuse the launch).
        Paths resolve against the workspace, as the supervisor's cwd makes them at run time."""
        params = self.effective(ctx.params)
        if not params["model_path"]:
            params["model_path"] = ctx.target.get("path")
        resolved = EstimateContext(root=ctx.root, params=params, target=ctx.target)
        model = resolved.path("model_path")
        if params.get("drafter"):
            params["drafter"] = str(resolved.path("drafter"))
        return command.lint(params, str(model) if model else None, gpus, ctx.target)

    def serves(self, params: dict) -> Server:
        """Where the server listens and what it serves, from the stage's effective params
        (the snapshot's ServeMonitor, a bench bound to it, a dependency on it)."""
        rts = params.get("ready_timeout_s")
        return Server(host=str(params.get("host") or self.params["host"]),
                      port=int(params.get("port") or self.params["port"]),
                      mode=params.get("mode"), ready_timeout_s=float(rts) if rts else None)

    def spreads(self, params: dict) -> str | None:
        return "sglang"


SPEC = Serve()
