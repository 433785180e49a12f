"""CUDA allocator snapshots (``torch.cuda.memory._snapshot()`` pickles): totals, replay, stacks, roles, per-call views."""
