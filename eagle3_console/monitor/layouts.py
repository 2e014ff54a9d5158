"""The layouts of a hidden-state output: which file names are samples, where.

Where it sits: monitor/samplefiles.py asks classify() / folder_layouts() of
every file the tree index lists; the layout holding most samples is the one
ShardProgress names (layout_of).

Layouts (shared/DESIGN.md), told apart by where the sample files are:
- eagle3:          rows_<a>-<b>/data_<i>.safetensors   (ours)
- specforge:       rows_<a>-<b>/data_<i>.pt or .ckpt    (the seed's and SpecForge's)
- speculators_pt:  data_<i>.pt in the root              (speculators)
- speculators_hs:  hs_<i>.safetensors in the root        (speculators)
A mix is counted in full and named after the layout holding most samples.
- glob:            a custom stage's own `sample_glob` (e.g. `sample_*.bin`),
                   matched against each file's path under the root (fnmatch:
                   `*` also crosses `/`); then only those files count."""

from __future__ import annotations

import re
from collections import Counter

from ops.formats import SAMPLE_RE, SHARD_DIR_RE

EAGLE3, SPECFORGE, SPEC_PT, SPEC_HS, NONE = (
    "eagle3", "specforge", "speculators_pt", "speculators_hs", "none")
GLOB = "glob"
_LAST_INT = re.compile(r"(\d+)(?!.*\d)")
_ROOT = {"safetensors": SPEC_HS, "pt": SPEC_PT, "ckpt": SPEC_PT}
_SHARD = {"safetensors": EAGLE3, "pt": SPECFORGE, "ckpt": SPECFORGE}


def folder_layouts(rel_dir: str) -> dict[str, str] | None:
    """Sample extension -> layout for the files of one folder; None where no sample can be."""
    if rel_dir == "":
        return _ROOT
    if "/" not in rel_dir and SHARD_DIR_RE.match(rel_dir):
        return _SHARD
    return None


def classify(rel_dir: str, name: str) -> tuple[str, int, str] | None:
    """(layout, sample index, extension) of a sample file, None for other files."""
    m = SAMPLE_RE.match(name)
    if m is None:
        return None
    layouts = folder_layouts(rel_dir)
    if layouts is None:
        return None
    ext = m.group(2)
    return layouts[ext], int(m.group(1)), ext


def last_int(name: str) -> int:
    """A custom pattern's sample index: the last number in its file name, else 0."""
    m = _LAST_INT.search(name)
    return int(m.group(1)) if m else 0


def layout_of(done: int, per_layout: Counter) -> str:
    """The layout holding most samples (NONE for none)."""
    if not done:
        return NONE
    return max(per_layout.items(), key=lambda kv: kv[1])[0]
