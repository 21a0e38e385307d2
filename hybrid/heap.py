"""A process's start-up heap, kept out of the cyclic garbage collector's full scans.

After start-up a worker holds millions of objects that live as long as the process: the
modules, classes and functions of torch, transformers and vLLM. Every full collection walks
all of them, about 0.3 s each on a 2-core CPU, and Python runs one whenever enough new
objects have survived; vLLM's engine build alone asks for five (its memory profiling).
Frozen (`gc.freeze`), they are left out of every later scan, and what is made after the
freeze is collected as before. Reference counting frees frozen objects as usual; only a cycle
among them would outlive its last use, which start-up objects never reach.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def freeze_heap() -> None:
    """Leave every object alive now out of later collections (call once the imports and other
    start-up work are done; calling again adds what was made since)."""
    gc.collect(1)  # the young generations' garbage goes first (cheap: they are small)
    gc.freeze()


@contextlib.contextmanager
def heap_kept_frozen() -> Iterator[None]:
    """Within, `gc.unfreeze()` does nothing. For a library's teardown that unfreezes the whole
    heap to collect what it made, in a process that ends soon after: vLLM's engine shutdown
    then runs two full collections over the ~750,000 start-up objects of torch,
    transformers and vLLM (1.6 s of CPU on a 2-core CPU; 0.01 s kept frozen). The frozen
    objects that form cycles stay until the process ends."""
    unfreeze = gc.unfreeze
    gc.unfreeze = _kept_frozen  # the module's attribute: what the libraries call
    try:
        yield
    finally:
        gc.unfreeze = unfreeze


def _kept_frozen() -> None:
    pass
