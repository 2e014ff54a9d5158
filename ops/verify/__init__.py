"""The verify stage: checks an extract output (see spec.py, __main__.py)."""
