"""The verifier's part of a speculators export: <export>/speculators/verifier/.

speculators 0.9.0 reads `speculators_config.verifier.name_or_path` on every
load, as a path relative to the current directory or else a Hub id:
speculators/model.py `_load_verifier_weights` takes embed_tokens.weight,
lm_head.weight and model.norm.weight through utils/loading.py
`load_model_layers` (a folder's model.safetensors), and
models/eagle3/core.py reads the verifier's config.json through AutoConfig
(num_hidden_layers for the aux layer ids, hidden_size for a size check).
A local target's absolute path stops resolving when the workspace moves, so
the export carries exactly those files; a loader that points name_or_path at
this folder (README: "Loading the speculators export") loads it wherever it
lies, from any directory, with the target gone.
"""

from __future__ import annotations

from pathlib import Path

VERIFIER_DIR = "verifier"


def verifier_tensors(head) -> dict:
    """What `load_model_layers` asks the verifier for, in the target's own dtype
    (what speculators would read from the target itself); an absent
    lm_head.weight is read as the embedding, so a tied target's is not stored twice."""
    tensors = {"embed_tokens.weight": head.embed.contiguous(), "model.norm.weight": head.norm.contiguous()}
    if not head.tied:
        tensors["lm_head.weight"] = head.lm_head.contiguous()
    return tensors


def write_verifier(fmt_dir: Path, target: Path, head) -> Path:
    """<fmt_dir>/verifier/{config.json (the target's, as it is), model.safetensors}."""
    from ops.drafter import diskio

    dest = Path(fmt_dir) / VERIFIER_DIR
    dest.mkdir()
    diskio.write_text(dest / "config.json", (Path(target) / "config.json").read_text())
    diskio.save_safetensors(verifier_tensors(head), dest / "model.safetensors", metadata={"format": "pt"})
    return dest

