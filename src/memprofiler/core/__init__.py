"""The framework-agnostic core: the profiler that coordinates collectors on a schedule, the
decorator, and the cross-rank summary."""
