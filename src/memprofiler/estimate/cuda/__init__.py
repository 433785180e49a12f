"""The CUDA device model: what a target GPU and torch release allocate beyond the ops' outputs."""
