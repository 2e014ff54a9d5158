"""The export stage: the trained drafter in SGLang's and speculators/vLLM's formats (python -m ops.export)."""
