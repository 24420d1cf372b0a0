"""`EngineMeter`: an engine that measures how long it sat with nothing to generate.

While a rollout window is open (`open` .. `close_window`), the time with no generate call in
flight is the "GPU-idle equivalent" of waiting on tools and grading, the share the paper's
load-balanced scheduler exists to shrink. `turns` and `tokens` count the generate calls
answered and the tokens they returned since the engine started (a failed call counts as a turn
with its tokens, usually none): the trainer reads them around an update to measure what was
generated while the policy trained.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from rstar2_rollout import (
    Engine,
    EngineProgress,
    Generation,
    KVCapacity,
    ProgressEngine,
    SamplingParams,
)


class EngineMeter:
    """An `Engine` that counts in-flight generate calls and the time it had none."""

    def __init__(self, engine: Engine) -> None:
        self.inner = engine
        self.name = engine.name
        self._in_flight = 0
        self._idle_since: float | None = None
        self.idle_s = 0.0
        self.busy = False  # True while a rollout window is open
        self.turns = 0  # generate calls answered, since the start
        self.tokens = 0  # tokens those calls returned

    def open(self) -> None:
        self.busy, self.idle_s = True, 0.0
        self._idle_since = time.perf_counter() if self._in_flight == 0 else None

    def close_window(self) -> float:
        if self._idle_since is not None:
            self.idle_s += time.perf_counter() - self._idle_since
        self.busy, self._idle_since = False, None
        return self.idle_s

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str
    ) -> Generation:
        if self._in_flight == 0 and self._idle_since is not None:
            self.idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None
        self._in_flight += 1
        try:
            out = await self.inner.generate(prompt_ids, params, request_id)
            self.turns += 1
            self.tokens += len(out.token_ids)
            return out
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self.busy:
                self._idle_since = time.perf_counter()

    def kv_capacity(self) -> KVCapacity | None:
        return self.inner.kv_capacity()

    def progress(self) -> EngineProgress | None:
        """The inner engine's progress report, if it gives one (`ProgressEngine`)."""
        return self.inner.progress() if isinstance(self.inner, ProgressEngine) else None

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await self.inner.update_weights(named_tensors)

    async def close(self) -> None:
        await self.inner.close()
