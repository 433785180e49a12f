"""Torch-free reading and analysis of a run's files, by format: the run's own files (``runs/``),
allocator snapshots (``snapshot/``), profiler traces (``traces/``), read safely (``files/``); diff,
budgets and the estimate's line on top."""
