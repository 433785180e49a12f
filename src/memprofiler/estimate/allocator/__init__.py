"""The CUDA caching allocator's model: its block and segment rules, and the replay of real traces."""
