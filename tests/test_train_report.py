"""train's report_to = "tensorboard" (issue 12, s4): the scalars written under
<output>/tb/ are metrics.jsonl's, read back from the event files themselves
(TFRecord framing, the Event protobuf); with the default nothing is imported
or written; asked for without the writer installed, one clear line, exit 2."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


ROOT = Path(__file__).resolve().parent.parent


def argv(assets, out: Path, *extra: str) -> list[str]:
    return ["--data", str(assets["data"]), "--vocab", str(assets["vocab"]), "--target", str(assets["target"]),
            "--output", str(out), "--workers", "0", "--token-budget", "256", "--ttt-steps", "3",
            "--log-every", "2", "--max-steps", "6", "--save-every", "1000", *extra]


def read_scalars(tb: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value from every event file under tb/."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, dict[int, float]] = {}
    files = sorted(tb.glob("events.out.tfevents.*"))
    assert files, f"no event file under {tb}"
    for path in files:
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (length,) = struct.unpack_from("<Q", data, i)
            record = data[i + 12:i + 12 + length]          # u64 length, u32 its crc, data, u32 data crc
            i += 12 + length + 4
            ev = Event.FromString(record)
            for v in ev.summary.value:
                out.setdefault(v.tag, {})[ev.step] = v.simple_value
    return out


def test_tensorboard_scalars_are_the_metrics(assets, tmp_path):
    pytest.importorskip("tensorboardX")
    from ops.train.__main__ import main

    torch.set_num_threads(1)
    out = tmp_path / "run"
    assert main(argv(assets, out, "--report-to", "tensorboard")) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6]
    scalars = read_scalars(out / "tb")
    expected = {"train/loss", "train/simulated_acceptance_length", "train/lr", "train/grad_norm", "train/tok_s"}
    expected |= {f"train/{key}/{k}" for key in ("step_loss", "acc") for k in (1, 2, 3)}
    assert set(scalars) == expected, set(scalars) ^ expected
    for rec in records:
        s = rec["step"]
        for key in ("loss", "simulated_acceptance_length", "lr", "grad_norm", "tok_s"):
            assert scalars[f"train/{key}"][s] == pytest.approx(rec[key], rel=1e-6), (key, s)
        for key in ("step_loss", "acc"):
            for k, v in enumerate(rec[key], 1):
                assert scalars[f"train/{key}/{k}"][s] == pytest.approx(v, rel=1e-6), (key, k, s)


def _probe(assets, out: Path, extra: list[str], block: bool) -> subprocess.CompletedProcess:
    # block: the writers absent, as an import finds an absent package (None in sys.modules).
    code = textwrap.dedent(f"""
        import sys
        if {block!r}:
            sys.modules["tensorboardX"] = None
            sys.modules["torch.utils.tensorboard"] = None
        from ops.train.__main__ import main
        rc = main({argv(assets, out, *extra)!r})
        sys.stderr.write("TB=" + str(any(m.split(".")[0] == "tensorboardX" or m == "torch.utils.tensorboard"
                                       for m in sys.modules if sys.modules[m] is not None)) + "\\n")
        sys.exit(rc)
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=240)


def test_default_imports_and_writes_nothing(assets, tmp_path):
    out = tmp_path / "run"
    proc = _probe(assets, out, [], block=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TB=False" in proc.stderr and not (out / "tb").exists()
    assert (out / "metrics.jsonl").exists()


def test_asked_for_without_the_writer_is_one_line_exit_2(assets, tmp_path):
    out = tmp_path / "run"
    proc = _probe(assets, out, ["--report-to", "tensorboard"], block=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: report_to = tensorboard needs tensorboardX: "
                      "pip install 'eagle3-console[tensorboard]'"], proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()     # said before anything was written
