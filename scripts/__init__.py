"""Benchmark scripts and their shared helpers (run each as `.venv/bin/python scripts/NAME.py`)."""
