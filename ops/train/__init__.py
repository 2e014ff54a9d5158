"""The train stage: fits the EAGLE-3 drafter on extracted hidden states (python -m ops.train)."""
