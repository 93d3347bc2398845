"""Library behind benchmark/run.py (the standard library only; sglang in the bench driver and the paired schedule)."""
