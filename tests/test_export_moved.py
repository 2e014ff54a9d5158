"""The speculators export after its workspace moved: speculators 0.9.0 reads
the verifier (`speculators_config.verifier.name_or_path`) on every load, and
the target's absolute path is gone once the workspace is moved. The export
carries what that load reads (ops/export/verifier.py); README's load line
points at it. Played end to end: export on the toy target in a workspace,
`shutil.move` the whole workspace, load with speculators' own Eagle3DraftModel
in a fresh process from another directory. The toy target and its trained
drafter come from conftest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
ENV.pop("EAGLE3_RUN_ID", None)
# Two subprocesses (export, then the speculators loads: ~10 s of CPU) on a shared machine.
pytestmark = pytest.mark.timeout(600)

# README's "Loading the speculators export" line, then what the other
# speculators test does to run it (eager attention: the default flex block
# mask wants 128-token multiples). "as-written" loads the file as it is.
LOAD = r"""
import os, sys, torch
from safetensors.torch import load_file, save_file
from speculators.models.eagle3 import Eagle3DraftModel

inputs, loads = sys.argv[1], sys.argv[2:]
data = load_file(inputs)
for export, mode, out in zip(loads[0::3], loads[1::3], loads[2::3]):
    cfg = Eagle3DraftModel.config_class.from_pretrained(export)
    if mode == "bundled":
        cfg.speculators_config.verifier.name_or_path = os.path.join(export, "verifier")
    cfg.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel.from_pretrained(export, config=cfg).float().eval()
    got, res = [], {}
    model.lm_head.register_forward_hook(lambda m, a, o: got.append(o.detach().clone()))
    with torch.no_grad():
        model(hidden_states=data["aux"], input_ids=data["ids"], document_ids=torch.zeros_like(data["ids"]),
              ttt_steps=3)
    for k, lg in enumerate(got):
        res[f"logits_{k}"] = lg.contiguous()
    res["verifier_lm_head"] = model.verifier_lm_head.weight.detach().float().contiguous()
    res["verifier_norm"] = model.verifier_norm.weight.detach().float().contiguous()
    save_file(res, out)
"""


def run(argv, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=cwd)


@pytest.fixture(scope="module")
def workspace(assets, trained, tmp_path_factory):
    """A workspace holding the toy target and the export of conftest's trained
    drafter, the target given relative to the workspace as eagle3.toml gives it."""
    ws = tmp_path_factory.mktemp("moving") / "ws"
    shutil.copytree(assets["target"], ws / "target")
    proc = run([sys.executable, "-m", "ops.export", "--checkpoint", str(trained), "--output", "export",
                "--target", "target", "--format", "speculators", "--no-check"], ws)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return ws


def load_with_speculators(tmp_path: Path, inputs: Path, cwd: Path, loads: list[tuple[Path, str, str]]) -> list[dict]:
    """Each (export, mode, name) loaded in turn by one fresh process (speculators' import
    alone is ~8 s of CPU), its tensors by name."""
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    argv = [sys.executable, str(script), str(inputs)]
    for export, mode, name in loads:
        argv += [str(export), mode, str(tmp_path / f"{name}.safetensors")]
    proc = run(argv, cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [load_file(str(tmp_path / f"{name}.safetensors")) for _, _, name in loads]


def test_the_speculators_export_loads_after_the_workspace_moved(workspace, tmp_path):
    """Before: the export named the target by its absolute path and carried
    nothing of it; after a move speculators' load took that path for a Hub id
    (HFValidationError), and there was no folder in the export to point it at."""
    pytest.importorskip("speculators", reason="bin/test installs speculators==0.9.0 --no-deps")

    ws = tmp_path / "ws"                # a copy of its own, so the fixture's stays for the other test
    shutil.copytree(workspace, ws)
    target_cfg = json.loads((ws / "target" / "config.json").read_text())
    gen = torch.Generator().manual_seed(3)
    inputs = tmp_path / "inputs.safetensors"
    save_file({"aux": torch.randn(1, 12, 3 * target_cfg["hidden_size"], generator=gen),
               "ids": torch.randint(0, target_cfg["vocab_size"], (1, 12), generator=gen)}, str(inputs))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    moved = shutil.move(str(ws), str(tmp_path / "moved-here"))
    assert not ws.exists()
    # One fresh process: first the moved copy through its bundled verifier (nothing of the
    # workspace's old place was read before it), then the reference: the same export as written,
    # the fixture's workspace in place (the copy's original, unmoved).
    after, before = load_with_speculators(tmp_path, inputs, elsewhere, [
        (Path(moved) / "export" / "speculators", "bundled", "after"),
        (workspace / "export" / "speculators", "as-written", "before")])

    logits = sorted(k for k in before if k.startswith("logits_"))
    assert len(logits) == 3 and sorted(k for k in after if k.startswith("logits_")) == logits
    worst = max(float((before[k] - after[k]).abs().max()) for k in logits)
    print(f"after the move vs in place: max |logit diff| {worst:.2e} over {len(logits)} steps")
    assert worst < 1e-6
    assert all(torch.equal(before[k].argmax(-1), after[k].argmax(-1)) for k in logits)
    # What speculators took from the verifier: the same as from the target itself.
    assert torch.equal(after["verifier_lm_head"], before["verifier_lm_head"])
    assert torch.equal(after["verifier_norm"], before["verifier_norm"])


def test_the_export_carries_the_verifier_speculators_reads(workspace):
    """Without speculators installed this still holds: the target's config.json
    as it is and the tensors speculators' loader asks the verifier for, as
    the target holds them."""
    from ops.drafter.target_head import load_target_head

    target = workspace / "target"
    verifier = workspace / "export" / "speculators" / "verifier"
    assert (verifier / "config.json").read_bytes() == (target / "config.json").read_bytes()
    head = load_target_head(target)
    w = load_file(str(verifier / "model.safetensors"))
    want = {"embed_tokens.weight": head.embed, "model.norm.weight": head.norm,
            **({} if head.tied else {"lm_head.weight": head.lm_head})}
    assert sorted(w) == sorted(want)
    for name, t in want.items():
        assert torch.equal(w[name], t), name
