"""The HF engine of extract: the target in transformers, states from forward hooks.

Where it sits: an Engine (engine.py) that run.py's loop drives. Under torchrun
every rank leads its own share of the samples (r::WORLD_SIZE) with a whole
copy of the target on its GPU (ops/target_model/model.py's placement); the forward
is the target's own (ops/target_model/forward.py HFTarget), shared with train's
online mode and export's check.
"""

from __future__ import annotations

import time

from ops.common import Coords, torchrun_coords
from ops.target_model import model as target_mod
from ops.target_model.forward import HFTarget
from ops.extract.loop import log
from ops.units import human_bytes

METHOD = "hf_transformers_forward_hooks"


class HFEngine:
    def __init__(self, args) -> None:
        self.compile = bool(args.compile)

    def coords(self) -> Coords:
        return torchrun_coords()

    def config_keys(self) -> dict:
        return {"extraction_method": METHOD}

    def leads(self) -> bool:
        return True

    def follow(self) -> int:
        raise RuntimeError("the HF engine has no followers: every rank leads its own share")

    def load(self, info, dtype, layer_ids, placement) -> "HFTarget":
        rank, world, _local = self.coords()
        log(f"loading target {info.path} ({human_bytes(info.weight_bytes)}, {dtype}) "
            f"on {placement.describe()}" + (f" [rank {rank}/{world}]" if world > 1 else ""))
        t0 = time.monotonic()
        model = target_mod.load_model(info, dtype, placement)
        log(f"target loaded in {(time.monotonic() - t0) / 60:.1f} minutes")
        if self.compile:
            from ops.target_model.capture import compile_layers
            log(f"compile: {compile_layers(model)} decoder layers compiled (torch.compile, one shared graph; "
                f"the first batches pay the compile)")
        return HFTarget(model, layer_ids)

    def close(self) -> None:
        pass
