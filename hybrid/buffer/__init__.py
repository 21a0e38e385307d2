"""The experience buffer between explorers and the trainer in the decoupled modes: finished
Samples in, whole GRPO groups out, bounded so that explorers wait when the trainer falls behind.
It holds Samples and knows nothing else: it imports only `hybrid.data.sample` (and Ray, for
the actor form)."""

from hybrid.buffer.errors import BufferClosedError, BufferTimeoutError
from hybrid.buffer.experience import BufferDepth, ExperienceBuffer, ExperienceBufferActor

__all__ = [
    "BufferClosedError",
    "BufferDepth",
    "BufferTimeoutError",
    "ExperienceBuffer",
    "ExperienceBufferActor",
]
