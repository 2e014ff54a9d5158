"""A torchrun worker whose rank 1 fails with its own one-line error and exit code 3,
as an op's rank does on bad input; rank 0 ends cleanly."""

import os
import sys

if os.environ.get("RANK") == "1":
    print(sys.argv[1] if len(sys.argv) > 1 else "error: /data/shard_7.bin: checksum mismatch (rank 1)",
          file=sys.stderr, flush=True)
    sys.exit(3)
