"""Tests that need a real NVIDIA GPU and driver (run on a GPU machine:
`pytest tests/gpu`). Everywhere else they skip and say why; the CPU suite
covers the same code through tests/fake_pynvml.py."""

from __future__ import annotations

import pytest

from eagle3_console.monitor.gpus import Nvml


@pytest.fixture
def nvml():
    """A real NVML session, or a skip naming why there is none."""
    session = Nvml(retry_s=None)
    report = session.sample()
    if not report.available:
        pytest.skip(f"NVML unavailable on this machine: {report.reason}")
    yield session
    session.shutdown()
