"""eagle3-console: an operations console for training EAGLE-3 drafters.

Data flow: ops (stage programs + specs) -> runs (registry, supervisor)
-> monitor (samplers) -> snapshot (one truth) -> the TUI's panes / JSON / metrics.
"""

__version__ = "0.1.0"
