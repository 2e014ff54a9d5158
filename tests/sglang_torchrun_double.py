"""`python -m ops.extract` under torchrun with SGLang's forward path doubled
(tests/sglang_forward_double.py): the engine's ranks, gate and batch hand-off
are real, the model runner is the double. Each rank says on stderr how many
loads and forwards it ran."""

import os
import sys

import torch.distributed

from ops.common import run_main
from ops.extract import sglang_capture
from ops.extract.__main__ import main
from tests import sglang_forward_double as double

# Rank 1's KV pool smaller than rank 0's: the ranks must still cut each batch alike.
sglang_capture.load = lambda *a, **kw: double.load(*a, kv_slots=70 if os.environ.get("RANK") == "1" else 256, **kw)
sglang_capture.tp_cpu_group = double.tp_cpu_group
code = run_main(main, prog="extract")
forwards = [len(f) for load in double.LOADS for f in load["runner"].forwards]
# Whether the engine left the ranks' group before the exit (left to the interpreter's teardown,
# a gloo group's threads aborted rank 1 once).
group = "open" if torch.distributed.is_initialized() else "left"
print(f"double: rank {os.environ.get('RANK')} loads {len(double.LOADS)} forwards {len(forwards)} "
      f"samples {sum(forwards)} group {group}", file=sys.stderr, flush=True)
sys.exit(code)
