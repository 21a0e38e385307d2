"""Multi-turn agent rollouts: token-in/token-out trajectories with tools and environments,
driven step by step by the rollout host (docs/agents.md)."""
