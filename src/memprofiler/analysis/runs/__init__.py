"""A run's files found, verified and put together: artifacts, run ids, per-rank evidence, node-local directories."""
