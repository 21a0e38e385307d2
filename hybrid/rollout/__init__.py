"""Rollout: engines behind a small protocol (base.py; vLLM is the one runs use, engines.py
builds them) and the RolloutHost (host.py) that the colocated worker and the explorer both
hold to generate, score and stream."""

from hybrid.rollout.base import GeneratedSample, RolloutEngine

__all__ = ["GeneratedSample", "RolloutEngine"]
