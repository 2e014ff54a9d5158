"""The bench stage: reference EAGLE-3 speculative decoding against plain greedy (python -m ops.bench)."""
