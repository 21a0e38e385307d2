"""Data passed between the driver and workers: the Batch protocol, prompt datasets and the
prompt loader."""

from hybrid.data.batch import Batch
from hybrid.data.dataset import PromptDataset, PromptRow, read_rows, write_rows
from hybrid.data.loader import PromptLoader

__all__ = ["Batch", "PromptDataset", "PromptLoader", "PromptRow", "read_rows", "write_rows"]
