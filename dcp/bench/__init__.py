"""Benchmarks: each ``dcp bench <name>`` lives in ``dcp/bench/<name>.py``."""
