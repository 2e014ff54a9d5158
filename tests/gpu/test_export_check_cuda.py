"""export --check on the GPU (issue 36: on the CPU in float32 it took most of a Qwen2.5-1.5B
export's 195 s): an online run's check computes the held-out states with the target on CUDA and
unrolls both drafters there, and gives the CPU's verdict. Skips without CUDA."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine (export --device cuda needs one)")


def test_an_online_drafter_checks_on_cuda_as_on_the_cpu(cuda, assets, tmp_path):
    from ops.export.__main__ import main as export
    from tests.test_train_online import base_argv, online, run_train

    out = tmp_path / "drafter"
    assert run_train(base_argv(assets, out, *online(assets))) == 0
    checks = {}
    for device in ("cpu", "cuda"):
        dest = tmp_path / f"export-{device}"
        assert export(["--checkpoint", str(out), "--output", str(dest), "--dtype", "float32",
                       "--device", device]) == 0
        checks[device] = json.loads((dest / "export_info.json").read_text())["check"]
    for fmt in ("sglang", "speculators"):
        assert checks["cpu"]["formats"][fmt]["ok"] and checks["cuda"]["formats"][fmt]["ok"]
        assert checks["cuda"]["formats"][fmt]["rel_logit_err"] <= 1e-5
    assert checks["cpu"]["samples"] == checks["cuda"]["samples"]
