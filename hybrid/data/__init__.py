"""Data passed between the driver and workers: the Batch protocol (and, later, datasets)."""

from hybrid.data.batch import Batch

__all__ = ["Batch"]
