"""How data parallelism changes one rank's memory: the fake process group, FSDP2, DDP."""
