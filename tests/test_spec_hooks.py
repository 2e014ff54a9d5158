"""The console follows a spec's hooks (issue 21): give a built-in op's spec a
hook it never had (a copy of its SPEC, which ops.get_spec returns, with the
hook set on it) and the exporter, the curves, the panes, clean, bind and the
plan act on it, with no console change. Each test swaps one hook in."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3_console.kernel import config as cfg
from eagle3_console.kernel.model import Snapshot, StageStatus
from eagle3_console.kernel.workspace import Workspace
from ops.estimate import Estimate
from ops.spec import BadFiles, CurvePoint, CurveSource, Gauge, Lint, ResultView, Server, ServerParam


@pytest.fixture
def hook(monkeypatch):
    """hook(op, **fields): that op's SPEC with the fields replaced, for the test's length."""
    def swap(op: str, **fields):
        module = importlib.import_module(f"ops.{op}.spec")
        spec = copy.copy(module.SPEC)
        for name, value in fields.items():      # a method's stand-in, or a class attribute's
            setattr(spec, name, value)
        monkeypatch.setattr(module, "SPEC", spec)
        return spec
    return swap


def pipeline(tmp_path: Path, stages: str) -> tuple[Workspace, cfg.Pipeline]:
    target = '[target]\npath = "t"\nhidden_size = 8\nnum_layers = 4\nvocab_size = 100\n'
    (tmp_path / "pipeline.toml").write_text(target + stages)
    return Workspace.at(tmp_path), cfg.load(tmp_path / "pipeline.toml")


VOCAB = '[stages.vocab]\nop = "vocab"\nparams = { input = "runs/prep", output = "runs/vocab" }\n'


def collected(ws: Workspace, pipe: cfg.Pipeline, stage: str) -> StageStatus:
    """The stage as a snapshot's pass reads it (the one place that asks its op of its record)."""
    from eagle3_console.observe.snapshot import Collector
    col = Collector(ws, gpus=False)
    try:
        return col.collect(pipe).stage(stage)
    finally:
        col.close()


def test_a_specs_gauges_reach_the_exporter(hook, tmp_path):
    from eagle3_console.observe.exporter import families
    hook("vocab", gauges=lambda r: [Gauge("eagle3_vocab_coverage_ratio", "Coverage.", r.get("coverage"),
                                          (("kind", "masked"),))])
    ws, pipe = pipeline(tmp_path, VOCAB)
    (tmp_path / "runs/vocab").mkdir(parents=True)
    (tmp_path / "runs/vocab/vocab.json").write_text(json.dumps({"coverage": 0.9}))
    snap = Snapshot(workspace="/w", host="h", time=0.0, stages=[collected(ws, pipe, "vocab")])
    fam = {f.name: f for f in families(snap)}["eagle3_vocab_coverage_ratio"]
    assert [(s.labels, s.value) for s in fam.samples] == [({"stage": "vocab", "kind": "masked"}, 0.9)]


def test_a_specs_curves_are_read_from_its_file(hook, tmp_path):
    from eagle3_console.monitor.metrics import CurveTracker
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps({"n": n, "err": 1.0 / n}) + "\n" for n in (1, 2)))
    spec = hook("export", curves=CurveSource("steps.jsonl", lambda r: CurvePoint(r["n"], r["err"], (), None)))
    # The snapshot hands the stage's spec's curves to its tracker.
    c = CurveTracker().curves(StageStatus(name="x", op="export", status="running", outputs=[str(tmp_path)]), 0.0,
                              spec.curves)
    assert c.steps == [1, 2] and c.loss == [1.0, 0.5]


def test_a_specs_result_view_is_what_the_panes_show(hook, tmp_path):
    from eagle3_console.tui.panes import progress, stages
    hook("vocab", result_view=lambda r: ResultView(head=(("coverage ", "label"), (f"{r['c']:.0%}", "headline")),
                                                   bars=(("masked", r["c"]),), details=("from prepare",),
                                                   cell=(f"cov {r['c']:.0%}", "ok")))
    ws, pipe = pipeline(tmp_path, VOCAB)
    (tmp_path / "runs/vocab").mkdir(parents=True)
    (tmp_path / "runs/vocab/vocab.json").write_text(json.dumps({"c": 0.5}))
    # The view as the snapshot read it, on a run that wrote the record.
    st = dataclasses.replace(collected(ws, pipe, "vocab"), status="succeeded", run_id=1, started=10.0, result_time=20.0)
    assert progress.result_text(st).plain == "coverage 50%"
    assert progress.result_details(st).plain == "from prepare"
    assert ("masked", "", 0.5, "50%") in progress.bar_rows(st)
    assert stages.result_text(st).plain == "cov 50%"
    # The same record under a spec without the hook: nothing shown.
    importlib.import_module("ops.vocab.spec").SPEC.result_view = lambda r: None
    (tmp_path / "runs/vocab/vocab.json").write_text(json.dumps({"c": 0.5, "again": True}))
    assert collected(ws, pipe, "vocab").view is None


def test_a_specs_bad_files_are_what_clean_offers(hook, tmp_path):
    from eagle3_console.actions.clean import _reported_bad
    seen = []

    def read(report, output, base):
        seen.append((report, output, base))
        return [SimpleNamespace(path=output / "bad")]
    hook("export", bad_files=BadFiles(output_param="checkpoint", report_param="data", read=read))
    ws, pipe = pipeline(tmp_path, '[stages.judge]\nop = "export"\n'
                                  'params = { checkpoint = "runs/data", output = "runs/x", data = "r.json" }\n')
    bad, report, data = _reported_bad(ws, pipe, [ws.resolve("runs/data")])
    assert data == ws.resolve("runs/data") and report == ws.resolve("r.json")
    assert [b.path for b in bad] == [data / "bad"] and seen == [(report, data, ws.root)]


def test_a_specs_server_is_what_a_server_param_binds(hook, tmp_path):
    from eagle3_console import runs
    hook("vocab", serves=lambda p: Server("10.1.2.3", 4321, "draft"))
    hook("export", server_params=(ServerParam("data", "checkpoint", "draft"),))
    ws, pipe = pipeline(tmp_path, VOCAB + '[stages.exp]\nop = "export"\n'
                                          'params = { checkpoint = "x", output = "runs/exp", data = "vocab" }\n')
    params = runs.stage_params(pipe.stage("exp"), pipe=pipe)
    assert params["checkpoint"] == "http://10.1.2.3:4321"
    assert runs.serves(pipe.stage("vocab")) and not runs.serves(pipe.stage("exp"))
    hook("export", server_params=(ServerParam("data", "checkpoint", "other"),))
    with pytest.raises(runs.Refused, match="needs a 'other' server"):
        runs.stage_params(pipe.stage("exp"), pipe=pipe)


def test_a_specs_lint_estimate_and_plan_lines_are_the_plans(hook, tmp_path):
    from eagle3_console.runs import plan
    from eagle3_console import runs
    hook("vocab", lint=lambda ctx, gpus: [Lint("error", f"{ctx.stage}: {ctx.params['input']}")],
         estimate=lambda ctx: Estimate(1000, "exact", f"from {ctx.upstream('input').name}"),
         plan_lines=lambda ctx: [f"plan of {ctx.stage}"])
    ws, pipe = pipeline(tmp_path, '[stages.prep]\nop = "prepare"\n'
                                  'params = { input = "c.jsonl", output = "runs/prep" }\n' + VOCAB)
    st = pipe.stage("vocab")
    params = dict(st.params)
    assert [str(x) for x in runs.lints(ws, pipe, st, params)] == ["error: vocab: runs/prep"]
    assert plan.disk_estimate(ws, pipe, st, params) == Estimate(1000, "exact", "from prep")
    lines = plan.launch_lines(ws, pipe, st, params, plan.preflight(ws, pipe, st, params))
    assert lines[0].startswith("disk: exact") and lines[-1] == "plan of vocab"


def test_estimate_rule_labels_an_ops_estimate(hook, tmp_path):
    from eagle3_console.runs import plan
    hook("vocab", estimate_rule="a rule of its own")
    ws, pipe = pipeline(tmp_path, VOCAB)
    est = plan.disk_estimate(ws, pipe, pipe.stage("vocab"), dict(pipe.stage("vocab").params))
    assert est.kind == "estimate" and est.basis == "vocab's rule: a rule of its own"
