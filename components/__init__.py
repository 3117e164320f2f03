"""Ratchet's building blocks. Nothing here imports `flows` or prefect: every block runs as a plain function."""
