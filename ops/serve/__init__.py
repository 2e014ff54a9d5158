"""The serve stage: a managed SGLang server, target alone or speculative EAGLE3 (python -m ops.serve)."""
