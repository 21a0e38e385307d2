"""`Worker`: the base class of every member hosted by a WorkerDict.

A member learns where it stands from `self.rank_env`, read from the environment that the
worker group exported, once, when the member is created: libraries that the member starts
(vLLM, torchrun-style launchers) may rewrite those variables later.
"""

from __future__ import annotations

from typing import Any

from hybrid.controller.rank_env import RankEnv


class Worker:
    """Subclass this and decorate driver-callable methods with `@register(...)`.

    The rank environment is captured before the subclass's `__init__` runs, so no
    `super().__init__()` call is needed and `self.rank` works inside `__init__`.
    """

    rank_env: RankEnv

    def __new__(cls, *args: Any, **kwargs: Any) -> Worker:
        instance = super().__new__(cls)
        instance.rank_env = RankEnv.from_environ()
        return instance

    @property
    def rank(self) -> int:
        return self.rank_env.rank

    @property
    def world_size(self) -> int:
        return self.rank_env.world_size
