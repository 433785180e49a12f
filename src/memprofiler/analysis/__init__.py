"""Torch-free reading and analysis of a run's files: loading, safe unpickling, allocator-snapshot analysis, diff, budgets, trace merging."""
