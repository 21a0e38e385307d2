"""The driver: GRPO loop, typed config tree, metrics sinks, checkpoints."""
