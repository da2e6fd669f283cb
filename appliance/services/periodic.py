"""A background task that calls a function every interval and survives its failures."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


class Periodic:
    """Runs `fn` every `interval_s()` seconds from start() until stop(); logs, never dies."""

    def __init__(
        self,
        name: str,
        fn: Callable[[], Awaitable[object] | object],
        interval_s: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self._name = name
        self._fn = fn
        self._interval_s = interval_s
        self._log = log
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    @property
    def running(self) -> bool:
        """Whether the loop is started and has not ended."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s())
            try:
                result = self._fn()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # one bad round must not stop the loop for good
                self._log.exception("%s failed", self._name)
