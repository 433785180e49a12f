"""PyTorch profiler (Kineto) traces: the one streaming reader, its views, memory by category, merging ranks."""
