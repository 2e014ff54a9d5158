"""A disk estimate with how it was made: what plan.disk_estimate returns and
an op's OpSpec.estimate hook makes (extract's: ops/extract/estimate.py).

An estimate is one of (Estimate.kind):
- "exact": the token count is known (prepare's summary.json, or the stage's
  `tokens` param): tokens x (aux layers + 1) x hidden_size x dtype bytes;
- "metadata": from the output tree's own records (a foreign tree: the seed's
  data_config.json `total_tokens` / `hidden_size` / `num_layers_captured`,
  speculators' `data.num_samples`, the tokens in sample_lengths.json);
- "upper_bound": no token count yet (prepare has not run): samples x
  max_seq_len x (aux layers + 1) x hidden_size x dtype bytes, every sample
  taken at its longest;
- "declared": the pipeline file's `estimate_bytes`;
- "estimate": another op's own rule (prepare: ~1.5 x its input, ...).
Once files land, the disk monitor's projection (written / fraction done) is
the "measured" figure (model.DiskUsage.final_kind).
"""

from __future__ import annotations

from dataclasses import dataclass

from ops.units import human_bytes, si_bytes  # noqa: F401 - si_bytes: estimate's figures in both units

KIND_LABEL = {"exact": "exact", "metadata": "from the tree's metadata", "upper_bound": "upper bound",
              "declared": "declared", "estimate": "estimate", "measured": "measured"}


@dataclass(frozen=True)
class Estimate:
    bytes: int
    kind: str       # exact | metadata | upper_bound | declared | estimate (KIND_LABEL)
    basis: str      # how the figure was made, in words and factors

    @property
    def label(self) -> str:
        return KIND_LABEL.get(self.kind, self.kind)

    def describe(self) -> str:
        return f"{self.label} {human_bytes(self.bytes)} ({si_bytes(self.bytes)}) = {self.basis}"
