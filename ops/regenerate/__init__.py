"""The regenerate stage: the target answers a prompts file (spec.py, __main__.py)."""
