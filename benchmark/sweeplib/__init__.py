"""Library behind benchmark/sweep.py: server command lines, server lifecycle, bench_serving runs,
the TTFT probe, result files, tables and plots. Only the standard library is needed, except
matplotlib for the plots (imported when plots are written)."""
