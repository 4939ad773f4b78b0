"""Two Triton backends installed side by side, both active: a host where Triton cannot guess."""
