"""README says what the tool does: every status `status` can show (a stage's
`never` and `stale` too), du's figure in the unit du prints (924G is GiB), and
no headline demo timing that the measured run further down contradicts."""

from __future__ import annotations

import re

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_the_statuses_include_never_and_stale():
    from eagle3_console.kernel.registry import RunStatus
    line = README[README.index("Statuses: "):].split("\n\n")[0]
    named = set(re.findall(r"`(\w+)`", line))
    runs = {v for k, v in vars(RunStatus).items() if k.isupper() and isinstance(v, str)}
    assert runs | {"never", "stale"} <= named, named


def test_du_is_said_in_gib():
    assert "924 GB" not in README and "924G, i.e. GiB" in README


def test_the_demo_section_has_no_headline_timing_beside_the_measured_one():
    section = README[README.index("### The demo workspace"):README.index("The demo's speed-up")]
    seconds = re.findall(r"\b(\d+) s\b", section)
    # Only the measured run's figures (its build and pipeline times) are given.
    assert set(seconds) == {"161", "394"}, seconds
