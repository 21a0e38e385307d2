"""Rollout engines behind a small protocol; the in-process vLLM engine is the one we ship."""

from hybrid.rollout.base import GeneratedSample, RolloutEngine

__all__ = ["GeneratedSample", "RolloutEngine"]
