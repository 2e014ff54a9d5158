"""The target model, run here: its config read and placed (model.py), forward hooks on its aux layers
(capture.py), one forward that returns a batch's states (forward.py, output.py).

Where it sits: below the stages, beside the drafter (pyproject.toml's import-linter contract): extract's HF
engine, train's online mode and export's check all run this one forward, as SpecForge's target model is one
class with a named output.
"""
