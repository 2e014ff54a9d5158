"""The engine of an extract run: who holds the target and runs its forward.

Where it sits: __main__.py opens the engine the `engine` param names
(engines.py open_engine), run.py's loop drives it through the Engine
protocol and never asks which one it has. Two engines: hf_engine.py (transformers with forward
hooks, each torchrun rank its own share of the samples) and sglang_run.py
(the target held by SGLang with tp/ep; rank 0 leads the loop as a world of
one, the other TP ranks follow it), as SpecForge puts both behind one
target-model class.

Importing this stays cheap (no torch), and it imports neither engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ops.common import Coords
from ops.target_model.output import TargetOutput

if TYPE_CHECKING:
    import numpy as np

    from ops.target_model.model import Placement, TargetInfo


class Target(Protocol):
    """A loaded target: one planned batch's token ids in, its states out."""

    def forward(self, tokens: Sequence["np.ndarray"]) -> TargetOutput:
        """The batch's two state tensors (what the loop sizes its host slabs
        by and copies from) and each sample's own rows of them."""

    def close(self) -> None:
        """The loop is done with the target (the forward hooks go, the followers are let go)."""


class Engine(Protocol):
    """What run.py's loop needs of an engine."""

    def coords(self) -> Coords:
        """(rank, world, local rank) in the data world: which samples are this
        process's (r::world) and who writes data_config.json (rank 0)."""

    def config_keys(self) -> dict:
        """data_config.json's keys that name the engine (extraction_method, ...)."""

    def leads(self) -> bool:
        """Whether this process runs the loop; a follower runs follow() instead."""

    def follow(self) -> int:
        """A follower's run: the leader's forwards, mirrored; the exit code."""

    def load(self, info: "TargetInfo", dtype: str, layer_ids: list[int], placement: "Placement") -> Target:
        """The target, loaded (minutes: only once something is left to extract)."""

    def close(self) -> None:
        """The leader's run is over, whether it loaded the target or not."""
